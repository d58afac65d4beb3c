#!/usr/bin/env bash
# On the GPU host: install the wheels carried in .dev/whl (numpy 2.4, gguf, nvmath-python)
# into /tmp/site. Source it: `source scripts/device_setup.sh`.
if [ -d .dev/whl ] && [ ! -f /tmp/site/.impnb-wheels ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .dev/whl/*.whl && touch /tmp/site/.impnb-wheels
fi
# The .pyc files an install would have: the hosts set PYTHONDONTWRITEBYTECODE and the staged wheels
# come without them, so every start would compile ~450 modules from source (0.9 s of a warm start).
python3 -m compileall -q -j 0 /tmp/site "$PWD/impnb" > /dev/null 2>&1 || true
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1

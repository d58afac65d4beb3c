"""Stop strings on a text stream: text is let through as it comes, except a tail that could still
grow into a stop string (held back until it cannot), and the first stop string ends it there,
wherever the token boundaries fall."""

from impnb.errors import ParameterError

MAX_STOPS = 16  # stop strings a request may give
MAX_STOP_CHARS = 1024  # characters one stop string may have


def check_stops(stop) -> tuple[str, ...]:
    """stop as a tuple of non-empty strings; ParameterError for anything else."""
    if stop is None:
        return ()
    if isinstance(stop, str):
        stop = [stop]
    if not isinstance(stop, (list, tuple)) or not all(isinstance(s, str) for s in stop):
        raise ParameterError("stop must be a string or a list of strings")
    if len(stop) > MAX_STOPS:
        raise ParameterError(f"stop holds {len(stop)} strings; at most {MAX_STOPS}")
    for s in stop:
        if not s or len(s) > MAX_STOP_CHARS:
            raise ParameterError(f"a stop string must have 1 to {MAX_STOP_CHARS} characters, got {len(s)}")
    return tuple(stop)


class StopMatcher:
    """Feed text chunks with push(); each returns the text that is safe to show and whether a stop
    string was found (the text then ends just before it)."""

    def __init__(self, stops: tuple[str, ...]):
        self.stops = stops
        self.held = ""  # the tail that is a prefix of some stop string
        self.stopped = False

    def push(self, text: str) -> tuple[str, bool]:
        if not self.stops:
            return text, False
        if self.stopped:
            return "", True
        buf = self.held + text
        hits = [i for i in (buf.find(s) for s in self.stops) if i >= 0]
        if hits:
            self.held, self.stopped = "", True
            return buf[:min(hits)], True
        keep = self._partial(buf)
        self.held = buf[len(buf) - keep:] if keep else ""
        return buf[:len(buf) - keep], False

    def flush(self) -> str:
        """What is held back, once no more text comes."""
        text, self.held = self.held, ""
        return text

    def _partial(self, buf: str) -> int:
        """The length of the longest tail of buf that a stop string starts with."""
        longest = min(max(len(s) for s in self.stops) - 1, len(buf))
        for n in range(longest, 0, -1):
            tail = buf[-n:]
            if any(s.startswith(tail) for s in self.stops):
                return n
        return 0

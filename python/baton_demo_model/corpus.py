"""The training text and its windows.

The text is "The Devil's Dictionary" (Ambrose Bierce, 1911) as Debian's dict-devil package
ships it: /usr/share/dictd/devil.dict.dz, a dictzip file that gzip reads. Its copyright file
says "The Devil's Dictionary is in the public domain, its copyright has expired". We keep the
entries, ABASEMENT to ZOOLOGY (380,683 bytes of ASCII), and drop the dictd headers and the
preface.

Each training window is the bos id and then `context` bytes of the text; half of a batch
starts at an entry ("PEACE, n.  In international affairs, ..."), half anywhere, because the
engines put bos before every prompt, whether it is a headword or the middle of a sentence.
"""
from __future__ import annotations

import gzip

DEFAULT_TEXT = "/usr/share/dictd/devil.dict.dz"
FIRST_ENTRY = b"ABASEMENT, n."
LAST_ENTRY = b"ZOOLOGY, n."
TITLE = "The Devil's Dictionary, Ambrose Bierce, 1911 (public domain; Debian package dict-devil)"


def read_corpus(path: str = DEFAULT_TEXT) -> bytes:
    """The dictionary's entries, ABASEMENT to ZOOLOGY; OSError or ValueError naming `path`."""
    with open(path, "rb") as f:
        raw = f.read()
    if raw[:2] == b"\x1f\x8b":
        raw = gzip.decompress(raw)
    first, last = raw.find(FIRST_ENTRY), raw.find(LAST_ENTRY)
    if first < 0 or last < 0:
        raise ValueError(f"{path}: not The Devil's Dictionary ({FIRST_ENTRY!r} or "
                         f"{LAST_ENTRY!r} is missing)")
    end = raw.find(b"\n\n", last)
    return raw[first:end + 1 if end >= 0 else len(raw)]


def entry_starts(text: bytes, context: int) -> list[int]:
    """Offsets of the entries (an upper-case letter after a blank line) that have `context`
    bytes after them."""
    starts = [0]
    i = text.find(b"\n\n")
    while i >= 0:
        j = i + 2
        if j < len(text) and 65 <= text[j] <= 90:
            starts.append(j)
        i = text.find(b"\n\n", j)
    return [s for s in starts if s + context <= len(text)]


def batch(torch, data, starts, generator, size: int, context: int, bos: int):
    """(inputs, targets), each (size, context): windows of bos and `context` bytes of `data`
    (a long tensor of the text), half of them at an entry in `starts`, half anywhere, drawn
    from `generator`."""
    half = size // 2
    at_entry = torch.randint(len(starts), (half,), generator=generator)
    anywhere = torch.randint(len(data) - context, (size - half,), generator=generator)
    offsets = torch.cat([torch.tensor(starts)[at_entry], anywhere])
    rows = torch.stack([data[o:o + context] for o in offsets.tolist()])
    windows = torch.cat([torch.full((size, 1), bos, dtype=torch.long), rows], dim=1)
    return windows[:, :-1], windows[:, 1:]

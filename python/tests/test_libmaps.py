"""baton_engine.libmaps: which mappings lose their page-table entries, that the pages of a
loaded library are no longer mapped afterwards and come back on use, and that every other
mapping keeps its pages and its contents."""
import mmap
import os
import subprocess
import sys
import tempfile
import unittest

import checkout_paths  # noqa: E402,F401 (the checkout's packages on sys.path)

from baton_engine import libmaps  # noqa: E402
from baton_engine.libmaps import Mapping  # noqa: E402

SMAPS = """\
7f0000000000-7f0000001000 r--p 00000000 08:01 11 /usr/lib/libx.so
Rss:                   4 kB
Anonymous:             0 kB
7f0000001000-7f0000003000 r-xp 00001000 08:01 11 /usr/lib/libx.so
Rss:                   8 kB
Anonymous:             0 kB
7f0000003000-7f0000004000 r--p 00003000 08:01 11 /usr/lib/libx.so
Rss:                   4 kB
Anonymous:             4 kB
7f0000004000-7f0000005000 rw-p 00004000 08:01 11 /usr/lib/libx.so
Rss:                   4 kB
Anonymous:             4 kB
7f0000005000-7f0000006000 r--p 00000000 08:01 12 /data/model.safetensors
Rss:                   4 kB
Anonymous:             0 kB
7f0000006000-7f0000007000 r--s 00000000 00:01 13 /memfd:baton-weights (deleted)
Rss:                   4 kB
Anonymous:             0 kB
7f0000007000-7f0000008000 r--p 00000000 00:00 0
Rss:                   4 kB
Anonymous:             4 kB
7f0000008000-7f0000009000 r-xp 00000000 08:01 14 /usr/lib/liby.so
Rss:                   0 kB
Anonymous:             0 kB
"""


class ParseTest(unittest.TestCase):
    def test_reads_each_mapping_with_its_sizes(self):
        maps = list(libmaps.parse_smaps(SMAPS.splitlines()))
        self.assertEqual(len(maps), 8)
        self.assertEqual(maps[0], Mapping(0x7f0000000000, 0x7f0000001000, "r--p", 11,
                                          "/usr/lib/libx.so", 4, 0))
        self.assertEqual(maps[5].path, "/memfd:baton-weights (deleted)")
        self.assertEqual(maps[6].path, "")
        self.assertEqual(maps[2].anonymous_kib, 4)

    def test_a_field_before_any_mapping_is_refused(self):
        with self.assertRaises(ValueError):
            list(libmaps.parse_smaps(["Rss: 4 kB"]))

    def test_only_untouched_read_only_pages_of_loaded_objects_are_droppable(self):
        maps = list(libmaps.parse_smaps(SMAPS.splitlines()))
        got = [(m.start, m.perms) for m in libmaps.droppable(maps)]
        # libx's header and text; not its RELRO (own pages), its data (writable), the model
        # file (not a loaded object), the weights (shared), the anonymous mapping, or liby's
        # text (nothing resident).
        self.assertEqual(got, [(0x7f0000000000, "r--p"), (0x7f0000001000, "r-xp")])


def resident_kib(predicate) -> int:
    with open("/proc/self/smaps") as f:
        return sum(m.rss_kib for m in libmaps.parse_smaps(f) if predicate(m))


class DropTest(unittest.TestCase):
    def test_drops_library_pages_and_the_process_goes_on(self):
        import decimal  # _decimal's library: resident now, not run again until the end

        def decimal_library(m):
            return "_decimal" in m.path and m.perms[1] != "w" and m.anonymous_kib == 0
        self.assertEqual(decimal.Decimal(1) / 8, decimal.Decimal("0.125"))
        before = resident_kib(decimal_library)
        self.assertGreater(before, 0)
        dropped = libmaps.drop_library_pages()
        self.assertGreater(dropped.mappings, 0)
        self.assertGreaterEqual(dropped.kib, before)
        self.assertEqual(resident_kib(decimal_library), 0)
        self.assertEqual(decimal.Decimal(1) / 8, decimal.Decimal("0.125"))
        self.assertGreater(resident_kib(decimal_library), 0)  # mapped again from the cache
        # Code of the dropped libraries still runs: a fresh interpreter's worth of work.
        import json
        import zlib
        self.assertEqual(json.loads(json.dumps({"a": [1, 2]})), {"a": [1, 2]})
        self.assertEqual(zlib.decompress(zlib.compress(b"x" * 1000)), b"x" * 1000)

    def test_other_mappings_keep_their_pages_and_bytes(self):
        with tempfile.NamedTemporaryFile() as f:
            f.write(os.urandom(1 << 16))
            f.flush()
            with open(f.name, "rb") as g:
                want = g.read()
            ro = mmap.mmap(f.fileno(), 0, prot=mmap.PROT_READ)
            cow = mmap.mmap(f.fileno(), 0, flags=mmap.MAP_PRIVATE)
            cow[:4] = b"baton"[:4]
            anon = mmap.mmap(-1, 1 << 16)
            anon[:] = b"\x07" * (1 << 16)
            self.assertEqual(ro[:], want)  # resident now

            def mine(m):
                return m.path == f.name or (m.inode == 0 and m.end - m.start == 1 << 16)
            before = resident_kib(mine)
            libmaps.drop_library_pages()
            self.assertEqual(resident_kib(mine), before)
            self.assertEqual(ro[:], want)
            self.assertEqual(cow[:4], b"bato")
            self.assertEqual(cow[4:], want[4:])
            self.assertEqual(anon[:], b"\x07" * (1 << 16))
            for m in (ro, cow, anon):
                m.close()

    def test_unreadable_smaps_is_an_os_error(self):
        with self.assertRaises(OSError):
            libmaps.drop_library_pages("/nonexistent/smaps")


class EngineTest(unittest.TestCase):
    def test_a_process_that_dropped_its_library_pages_runs_python_to_the_end(self):
        code = ("import sys; sys.path.insert(0, %r)\n"
                "from baton_engine import libmaps\n"
                "d = libmaps.drop_library_pages()\n"
                "import decimal, hashlib\n"
                "print(d.mappings > 0, hashlib.sha256(b'baton').hexdigest()[:8],"
                " decimal.Decimal(1) / 8)\n") % os.path.join(checkout_paths.PYTHON,
                                                              "baton-engine")
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                             check=True).stdout.split()
        self.assertEqual(out, ["True", "418c01e8", "0.125"])


if __name__ == "__main__":
    unittest.main(verbosity=2)

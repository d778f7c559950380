"""baton_engine without a controller: the library loads at the ABI it declares, failures
carry the SDK's code and reason, and a session refuses use after close."""
import os
import sys
import unittest

import checkout_paths  # noqa: E402,F401 (the checkout's packages on sys.path)
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import baton_engine  # noqa: E402
from baton_engine import _abi, errors  # noqa: E402


class LibraryTest(unittest.TestCase):
    def test_loads_at_its_abi_version(self):
        lib = _abi.load()
        self.assertEqual(lib.baton_engine_abi_version(), _abi.ABI_VERSION)

    def test_a_missing_library_names_every_place_it_looked(self):
        with self.assertRaises(OSError) as ctx:
            _abi.load("/nonexistent/libbaton_engine.so")
        self.assertIn("/nonexistent/libbaton_engine.so", str(ctx.exception))

    def test_every_c_function_is_declared(self):
        header = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..",
                              "standby", "sdk", "baton_engine.h")
        with open(header) as f:
            text = f.read()
        import re
        declared = set(re.findall(r"BATON_ENGINE_API [^(]*?\b(baton_engine_\w+)\(", text))
        self.assertGreater(len(declared), 20)
        self.assertEqual(declared, {name for name, _, _ in _abi._PROTOTYPES})


class Crc32cTest(unittest.TestCase):
    def test_is_the_kv_records_checksum_and_extends(self):
        self.assertEqual(baton_engine.crc32c(b"123456789"), 0xE3069283)
        self.assertEqual(baton_engine.crc32c(b"6789", baton_engine.crc32c(b"12345")),
                         0xE3069283)
        self.assertEqual(baton_engine.crc32c(b""), 0)


class ConnectTest(unittest.TestCase):
    def test_no_controller_is_unavailable_with_the_sdk_reason(self):
        with self.assertRaises(baton_engine.Unavailable) as ctx:
            baton_engine.Engine.connect(socket_path="/tmp/baton-no-such.sock", launch_token="t",
                                        engine_id=7, connect_timeout_ms=100)
        e = ctx.exception
        self.assertEqual(e.code, baton_engine.StatusCode.UNAVAILABLE)
        self.assertEqual(e.call, "connect")
        self.assertIn("/tmp/baton-no-such.sock", e.reason)

    def test_missing_launch_details_are_an_error_not_a_crash(self):
        env = {k: os.environ.pop(k) for k in ("BATON_SOCKET", "BATON_LAUNCH_TOKEN",
                                               "BATON_ENGINE_ID") if k in os.environ}
        try:
            with self.assertRaises(baton_engine.BatonError) as ctx:
                baton_engine.Engine.connect(connect_timeout_ms=100)
            self.assertTrue(ctx.exception.reason)
        finally:
            os.environ.update(env)


class LaunchFieldsTest(unittest.TestCase):
    NAMES = ("BATON_SOCKET", "BATON_LAUNCH_TOKEN", "BATON_ENGINE_ID")

    def setUp(self):
        self.saved = {k: os.environ.pop(k) for k in self.NAMES if k in os.environ}

    def tearDown(self):
        for k in self.NAMES:
            os.environ.pop(k, None)
        os.environ.update(self.saved)

    def test_each_field_not_passed_comes_from_its_own_variable(self):
        with self.assertRaises(baton_engine.InvalidArgument) as ctx:
            baton_engine.Engine.connect(socket_path="/tmp/baton-no-such.sock",
                                        launch_token="00" * 16, connect_timeout_ms=100)
        self.assertIn("BATON_ENGINE_ID", ctx.exception.reason)
        self.assertNotIn("BATON_SOCKET", ctx.exception.reason)
        os.environ["BATON_ENGINE_ID"] = "5"
        with self.assertRaises(baton_engine.Unavailable) as ctx:  # every field there: connects
            baton_engine.Engine.connect(socket_path="/tmp/baton-no-such.sock",
                                        launch_token="00" * 16, connect_timeout_ms=100)
        self.assertIn("/tmp/baton-no-such.sock", ctx.exception.reason)


class WholeChunksTest(unittest.TestCase):
    def test_whole_free_chunks_from_the_highest_while_they_fit(self):
        from baton_engine.reclaim import whole_chunks
        # A pool of 10 blocks in chunks of 4: [0, 4), [4, 8) and the short [8, 10).
        free = set(range(3, 10))
        self.assertEqual(whole_chunks(free, 4, 10, 6), list(range(4, 10)))
        self.assertEqual(whole_chunks(free, 4, 10, 5), [8, 9], "[4, 8) does not fit in 3")
        self.assertEqual(whole_chunks(free, 4, 10, 100), list(range(4, 10)), "[0, 4) not free")
        self.assertEqual(whole_chunks(free, 1, 10, 2), [8, 9])
        self.assertEqual(whole_chunks(set(), 4, 10, 8), [])


class ErrorsTest(unittest.TestCase):
    def test_each_code_has_its_class(self):
        cases = {1: baton_engine.InvalidArgument, 2: baton_engine.NotFound,
                 4: baton_engine.FailedPrecondition, 6: baton_engine.Unavailable,
                 8: baton_engine.DeadlineExceeded, 10: baton_engine.BatonError}
        for code, cls in cases.items():
            e = errors.error_for(code, "call", "why")
            self.assertIs(type(e), cls)
            self.assertEqual(int(e.code), code)
            self.assertIn("why", str(e))

    def test_an_unknown_code_is_internal(self):
        e = errors.error_for(99, "call", "why")
        self.assertIs(type(e), baton_engine.BatonError)
        self.assertEqual(e.code, baton_engine.StatusCode.INTERNAL)


class ClosedEngineTest(unittest.TestCase):
    def test_use_after_close_is_refused(self):
        engine = baton_engine.Engine(_abi.load(), None)
        engine._handle = None
        with self.assertRaises(baton_engine.FailedPrecondition):
            engine.pool()
        engine.close()  # idempotent


class DrillEngineTest(unittest.TestCase):
    """sdk_engine.py, the drills' engine, finds a block header another engine wrote."""

    class FakeEngine:
        id, epoch = 5, 9
        reported = []

        def report_error(self, message):
            self.reported.append(message)

    def test_a_foreign_header_is_a_violation_and_its_own_is_not(self):
        import ctypes
        import tempfile
        import sdk_engine
        block = (ctypes.c_uint8 * 64)()
        address = ctypes.addressof(block)
        with tempfile.TemporaryDirectory() as violations:
            stamper = sdk_engine.Stamper(self.FakeEngine(), 64, violations)
            stamper.stamp(address, 0, 5, 9)  # scrubbed: fine
            stamper.stamp(address, 0, 5, 9)  # its own stamp: fine
            self.assertEqual(os.listdir(violations), [])
            ctypes.memmove(address, sdk_engine.STAMP.pack(4, 8, 1), sdk_engine.STAMP.size)
            stamper.stamp(address, 0, 5, 9)
            self.assertEqual(os.listdir(violations), ["violation-5.txt"])
            self.assertIn("names engine 4 epoch 8", self.FakeEngine.reported[0])


if __name__ == "__main__":
    unittest.main()

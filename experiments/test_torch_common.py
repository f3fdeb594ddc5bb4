"""Tests of experiments/torch_common.py and of the PyTorch anchors' command lines, where no torch is
installed (a development machine): the harness's recording, CSV, timing and mean on the host
clock, and every experiments/*/*_torch.py (and hopper_report.py) compiling and answering --help
with a stand-in torch package (the scripts import torch at their top). spec/bench_spec.lua runs it.

  python3 experiments/test_torch_common.py [-v]
"""
import csv
import glob
import io
import os
import subprocess
import sys
import tempfile
import textwrap
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import torch_common as tc  # noqa: E402

# A stand-in torch: what the scripts touch at import time and before parsing their options,
# and what torch_common reads (versions; no GPU)
STUB = {
    "torch/__init__.py": """
        __version__ = "0.0-stub"
        class version:
            cuda = None
        class _Cuda:
            @staticmethod
            def is_available(): return False
            @staticmethod
            def device_count(): return 0
            @staticmethod
            def get_device_name(i=None): return "cpu"
            class nccl:
                @staticmethod
                def version(): return (2, 0, 0)
        cuda = _Cuda()
        class _Cudnn:
            @staticmethod
            def is_available(): return False
            @staticmethod
            def version(): return None
        class backends:
            cudnn = _Cudnn()
            class cuda:
                class matmul:
                    allow_bf16_reduced_precision_reduction = True
        bfloat16, float16, float32, float64, int32, int64 = "bf16", "f16", "f32", "f64", "i32", "i64"
        from . import distributed, nn  # noqa: E402,F401
    """,
    "torch/distributed/__init__.py": """
        class ReduceOp:
            MAX = "max"
    """,
    "torch/nn/__init__.py": "from . import functional, attention  # noqa: F401\n",
    "torch/nn/functional.py": "",
    "torch/nn/attention.py": """
        import enum
        class SDPBackend(enum.Enum):
            MATH = 0
            FLASH_ATTENTION = 1
            CUDNN_ATTENTION = 2
        def sdpa_kernel(b): raise RuntimeError("stub")
    """,
}

SCRIPTS = sorted(glob.glob(os.path.join(HERE, "*", "*_torch.py"))) + [os.path.join(HERE, "attn", "hopper_report.py")]


def read(path):
    with open(path) as f:
        return f.read()


def stub_dir():
    d = tempfile.mkdtemp(prefix="torch-stub-")
    for path, text in STUB.items():
        os.makedirs(os.path.dirname(os.path.join(d, path)), exist_ok=True)
        with open(os.path.join(d, path), "w") as f:
            f.write(textwrap.dedent(text))
    return d


class Recording(unittest.TestCase):
    def test_recorded_variables(self):
        for k in ("DISTLAB_AR_TABLE", "NCCL_NVLS_ENABLE", "CUDA_VISIBLE_DEVICES", "CUDNN_LOGLEVEL_DBG",
                  "CUBLAS_WORKSPACE_CONFIG", "CUBLASLT_LOG_LEVEL", "TORCH_CUDNN_SDPA_NESTED_TENSOR_ENABLED",
                  "PYTORCH_CUDA_ALLOC_CONF", "LD_LIBRARY_PATH"):
            self.assertTrue(tc.recorded(k), k)
        for k in ("DISTLAB_RANK", "DISTLAB_ROOT", "HOME", "PATH", "RANK", "WORLD_SIZE", "TORCHELASTIC_RUN_ID",
                  "TORCH_NCCL_ASYNC_ERROR_HANDLING", "OMP_NUM_THREADS"):
            self.assertFalse(tc.recorded(k), k)

    def test_command_python_and_torchrun(self):
        script = os.path.join(tc.ROOT, "experiments/overlap/ag_gemm_torch.py")
        env = {"NCCL_NVLS_ENABLE": "0", "HOME": "/root", "LD_LIBRARY_PATH": "/a b:/c", "DISTLAB_RANK": "1"}
        c = tc.command([script, "out.csv", "--ag-m", "8192"], env)
        self.assertTrue(c.startswith("LD_LIBRARY_PATH='/a b:/c' NCCL_NVLS_ENABLE=0 "), c)
        self.assertTrue(c.endswith(" experiments/overlap/ag_gemm_torch.py out.csv --ag-m 8192"), c)
        self.assertNotIn("HOME", c)
        self.assertNotIn("DISTLAB_RANK", c)
        env.update({"TORCHELASTIC_RUN_ID": "x", "LOCAL_WORLD_SIZE": "2", "WORLD_SIZE": "2", "RANK": "0"})
        c = tc.command([script, "o.csv"], env)
        self.assertIn(" torchrun --nproc_per_node 2 experiments/overlap/ag_gemm_torch.py o.csv", c)

    def test_header_is_distlab_benchs(self):
        info = {"device": "NVIDIA H200", "date": "2026-11-29 10:00 UTC", "commit": "abc1234", "command": "x `y`",
                "libraries": "torch 2.11"}
        lines = tc.header("T", info, ["method: m", "- knob: k"])
        self.assertEqual(["# T", "", "- device: NVIDIA H200", "- date: 2026-11-29 10:00 UTC", "- commit: `abc1234`",
                          "- command: `` x `y` ``", "- libraries: torch 2.11", "- method: m", "- knob: k"], lines)
        with tempfile.TemporaryDirectory() as d:
            p = tc.write_markdown(os.path.join(d, "a.md"), "T", info, [], tc.table(["a", "b"], [["x|y", None]]))
            back = tc.read_header(p)
            self.assertEqual(dict(info, title="T"), back)
            self.assertIn("| x\\|y | - |", read(p))

    def test_commit(self):
        old = os.environ.get("DISTLAB_COMMIT")
        os.environ["DISTLAB_COMMIT"] = "deadbee"
        try:
            self.assertEqual("deadbee", tc.commit())
        finally:
            if old is None:
                del os.environ["DISTLAB_COMMIT"]
            else:
                os.environ["DISTLAB_COMMIT"] = old


class CsvAndMean(unittest.TestCase):
    def test_fields_as_distlab_bench_csv(self):
        self.assertEqual(["", "3", "3", "0.5", "nan", "1.5", "true"],
                         [tc.field(v) for v in (None, 3, 3.0, 0.5, float("nan"), "1.5", True)])

    def test_csv_rows_flushed_and_quoted(self):
        with tempfile.TemporaryDirectory() as d:
            p = os.path.join(d, "a.csv")
            w = tc.Csv(p, ["impl", "m", "status"])
            w.row(["x", 1, "failed: a, b"])
            self.assertEqual('impl,m,status\nx,1,"failed: a, b"\n', read(p))  # before close
            w.row({"impl": "y", "m": 2})
            w.close()
            self.assertEqual([["impl", "m", "status"], ["x", "1", "failed: a, b"], ["y", "2", ""]],
                             list(csv.reader(io.StringIO(read(p)))))
            with self.assertRaises(ValueError):
                tc.Csv(os.path.join(d, "b.csv"), ["a"]).row([1, 2])

    def test_mean_of_runs(self):
        with tempfile.TemporaryDirectory() as d:
            a, b, out = (os.path.join(d, n) for n in ("a.csv", "b.csv", "m.csv"))
            with open(a, "w") as f:
                f.write("impl,m,ms,tflops,status,wrong\nt,8,1.000,10.0,ok,0\nt,16,2.0000,nan,ok,0\n")
            with open(b, "w") as f:
                f.write("impl,m,ms,tflops,status,wrong\nt,8,3.000,30.0,ok,2\nt,16,4.0000,5.0,\"failed: x\",-1\n"
                        "u,8,9,9,ok,0\n")
            tc.mean([a, b], ["impl", "m"], out, "ms")
            rows = list(csv.DictReader(io.StringIO(read(out))))
            self.assertEqual(3, len(rows))
            self.assertEqual({"impl": "t", "m": "8", "ms": "2.000", "tflops": "20.0", "status": "ok", "wrong": "2",
                              "runs": "2", "ms_runs": "1.000 / 3.000"}, rows[0])
            self.assertEqual(("3.0000", "5.0", "ok / failed: x", "-1"),
                             (rows[1]["ms"], rows[1]["tflops"], rows[1]["status"], rows[1]["wrong"]))
            self.assertEqual(("u", "1"), (rows[2]["impl"], rows[2]["runs"]))
            with open(b, "w") as f:
                f.write("impl,m,other\n")
            with self.assertRaises(ValueError):
                tc.mean([a, b], ["impl", "m"], out)


class Timing(unittest.TestCase):
    def test_stats_median_of_even_count(self):
        s = tc.stats([4, 1, 3, 2])
        self.assertEqual((2.5, 1, 4, 2.5, 4), (s["median"], s["min"], s["max"], s["mean"], s["iters"]))

    def test_host_clock_methods(self):
        calls = []
        st = tc.events(lambda: calls.append(1), warmup=2, iters=5)
        self.assertEqual((5, 7), (st["iters"], len(calls)))
        calls.clear()
        st = tc.events(lambda: calls.append(1), warmup=0, iters=3, warm_ms=0.0, min_ms=1e-9)
        self.assertGreaterEqual(st["iters"], 3)
        before = []
        self.assertEqual(4, len(tc.each(lambda: None, 4, lambda: before.append(1))))
        self.assertEqual(4, len(before))
        n = tc.warm(lambda: None, 1.0, least=3, agree=lambda x: x)
        self.assertGreaterEqual(n, 3)
        self.assertEqual(5, tc.host(lambda: None, warmup=1, batch=2, batches=5)["iters"])


class Planted(unittest.TestCase):
    class Fake:
        """A tensor's fill_, mul_ and is_floating_point, on a list."""
        def __init__(self, v, floating=True):
            self.v, self.floating = list(v), floating

        def fill_(self, x):
            self.v = [x] * len(self.v)
            return self

        def mul_(self, f):
            self.v = [a * f for a in self.v]
            return self

        def is_floating_point(self):
            return self.floating

    def test_parse_plant_is_verifys(self):
        self.assertIsNone(tc.parse_plant(None))
        self.assertIsNone(tc.parse_plant("none"))
        self.assertEqual("noop", tc.parse_plant("noop")["kind"])
        self.assertEqual(0.01, tc.parse_plant("scale=0.01")["x"])
        for bad in ("scale=0", "scale=-1", "scale=x", "zero"):
            self.assertRaises(ValueError, tc.parse_plant, bad)

    def test_noop_and_scale(self):
        out = self.Fake([0, 0])

        def fn():
            out.v = [2, 2]
        self.assertIs(fn, tc.planted(fn, None, writes=[out]))
        tc.planted(fn, tc.parse_plant("noop"), writes=[out])()
        self.assertEqual([0, 0], out.v)
        tc.planted(fn, tc.parse_plant("scale=0.5"), writes=lambda: [out])()
        self.assertEqual([3, 3], out.v)
        ret, idx = self.Fake([4]), self.Fake([1], floating=False)
        r = tc.planted(lambda: (ret, (idx, 7)), tc.parse_plant("noop"), returns=True)()
        self.assertTrue(r[0].v[0] != r[0].v[0])  # NaN: the returned float tensor holds nothing computed
        self.assertEqual([1], idx.v)
        ret.v = [4]
        self.assertEqual([5], tc.planted(lambda: ret, tc.parse_plant("scale=0.25"), returns=True)().v)
        self.assertRaises(ValueError, tc.planted, fn, tc.parse_plant("noop"))


def real_torch():
    """True where a real torch imports (not the stand-in), so that a script can run on gloo."""
    r = subprocess.run([sys.executable, "-c", "import torch.distributed as d; print(d.is_available())"],
                       capture_output=True, text=True)
    return r.returncode == 0 and r.stdout.strip().endswith("True")


class EpAnchorOnGloo(unittest.TestCase):
    """experiments/ep/ep_bench_torch.py at --quick on 2 cpu processes (gloo, nothing captured): clean it
    exits 0, and a planted error fails its data check in both modes. Where torch is installed."""

    def run_ep(self, *extra):
        d = tempfile.mkdtemp(prefix="ep-torch-")
        port = str(20000 + os.getpid() % 20000)
        r = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_port",
                            port, os.path.join(HERE, "ep", "ep_bench_torch.py"), os.path.join(d, "o.csv"), "--quick",
                            *extra], capture_output=True, text=True, timeout=300,
                           env=dict(os.environ, CUDA_VISIBLE_DEVICES=""))
        rows = list(csv.DictReader(open(os.path.join(d, "o.csv")))) if os.path.exists(os.path.join(d, "o.csv")) else []
        return r, rows

    @unittest.skipUnless(real_torch(), "no torch here (pip install torch into a venv and run this file with its python)")
    def test_clean_and_planted(self):
        r, rows = self.run_ep()
        self.assertEqual(0, r.returncode, r.stdout + r.stderr)
        self.assertIn("graph capture needs CUDA", r.stdout)
        self.assertEqual(["graph", "eager"], [x["mode"] for x in rows])
        self.assertEqual(["0", "0"], [x["wrong"] for x in rows])
        self.assertIn("eager (host-read counts)", rows[1]["method"])
        for plant in ("noop", "scale=0.01"):
            r, rows = self.run_ep("--plant", plant)
            self.assertEqual(1, r.returncode, r.stdout + r.stderr)
            self.assertIn("data check failed", r.stdout + r.stderr)
            # a crash in the script, not the data check (torchrun's own traceback reports the exit code 1)
            self.assertNotIn('ep_bench_torch.py", line', r.stdout + r.stderr)
            self.assertTrue(all(int(x["wrong"]) > 0 for x in rows), rows)


class Scripts(unittest.TestCase):
    def test_every_anchor_answers_help_with_a_stand_in_torch(self):
        self.assertGreaterEqual(len(SCRIPTS), 7)
        d = stub_dir()
        env = dict(os.environ, PYTHONPATH=d, PYTHONDONTWRITEBYTECODE="1")
        for s in SCRIPTS:
            r = subprocess.run([sys.executable, s, "--help"], env=env, capture_output=True, text=True, timeout=60)
            self.assertEqual(0, r.returncode, f"{s}: {r.stderr}")
            self.assertIn("usage:", r.stdout, s)

    def test_every_anchor_uses_the_harness(self):
        for s in SCRIPTS:
            text = read(s)
            self.assertIn("import torch_common as tc", text, s)
            for own in ("def commit(", "statistics.median(ev", "subprocess.run([\"git\""):
                self.assertNotIn(own, text, f"{s} times or records by itself ({own})")

    def test_libraries_with_a_stand_in_torch(self):
        d = stub_dir()
        r = subprocess.run([sys.executable, "-c", "import torch_common as tc; print(tc.libraries())"],
                           env=dict(os.environ, PYTHONPATH=d + os.pathsep + HERE), capture_output=True, text=True)
        self.assertEqual(0, r.returncode, r.stderr)
        self.assertRegex(r.stdout, r"^torch 0\.0-stub \(built for CUDA None\); CUDA runtime[^;]*; cuDNN not loaded; "
                                   r"NCCL not loaded; cuBLASLt not loaded\n$")


if __name__ == "__main__":
    result = unittest.main(exit=False, verbosity=2 if "-v" in sys.argv else 1).result
    n, bad = result.testsRun, len(result.failures) + len(result.errors)
    print(f"{n - bad} passed, {bad} failed")
    sys.exit(1 if bad else 0)

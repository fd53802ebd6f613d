"""The toolkit's GPU paths on a real NVIDIA GPU, through `train`, in one device call.

Lays out a job directory per check, runs the installed `train` on it and judges what it did:

- probe:   the hardware probe's GPU count and time, and `training-toolkit plan` for a torch_distributed
           job with no processes per host given (one process per GPU);
- ddp:     torch_distributed, nproc auto: one process per GPU, LOCAL_RANK, the device pinned, a small DDP
           model trained with NCCL, its loss going down;
- stall:   a rank blocked in a long CUDA kernel, TRAINING_TOOLKIT_STALL_TIMEOUT set: exit 124, that rank's
           Python stack naming the line, and no process of the job left on the GPU;
- sigterm: SIGTERM to `train` while the rank is in GPU work: the rank's handler runs within the grace,
           the verdict is the stop (143), nothing of the job left;
- restart: TRAINING_TOOLKIT_MAX_RESTARTS=1, the rank SIGKILLed mid-step: attempt 2 resumes from the
           checkpoint on the GPU and the job succeeds.

Writes OUT/gpu_check.json (every check's figures and verdict) and OUT/gpu_check.log (what `train` printed).
Exit status: 0 when every check passed.

    python bench/gpu_check.py --out DIR [--train PATH] [--toolkit PATH]
    python bench/gpu_check.py --out DIR --cpu     # the same flow without a GPU (gloo, one process): a dry run

bench/gpu_check.sh installs the toolkit on the device machine first and then runs this.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

PLATFORM = "sagemaker"

# The rank's script: one file, told what to do by GPU_CHECK_MODE.  Lines the checks look for are marked.
SCRIPT = r'''
import os, signal, sys, time
from pathlib import Path
import torch
import torch.distributed as dist

MODE = os.environ["GPU_CHECK_MODE"]
CPU = os.environ.get("GPU_CHECK_CPU") == "1"
local_rank = int(os.environ["LOCAL_RANK"])
rank = int(os.environ["RANK"])
world = int(os.environ["WORLD_SIZE"])
attempt = int(os.environ.get("TRAINING_TOOLKIT_RESTART_COUNT", "0"))
if CPU:
    device = torch.device("cpu")
else:
    torch.cuda.set_device(local_rank)
    device = torch.device("cuda", torch.cuda.current_device())
print(f"rank {rank}/{world} local_rank {local_rank} device {device} "
      f"visible {os.environ.get('CUDA_VISIBLE_DEVICES', '-')} sm_num_gpus {os.environ.get('SM_NUM_GPUS')} "
      f"attempt {attempt}", flush=True)
dist.init_process_group("gloo" if CPU else "nccl")


def sync():
    if not CPU:
        torch.cuda.synchronize()


def build():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.ReLU(), torch.nn.Linear(256, 1)).to(device)
    ddp = torch.nn.parallel.DistributedDataParallel(model, device_ids=None if CPU else [local_rank])
    return model, ddp, torch.optim.SGD(ddp.parameters(), lr=0.05)


def batch(step):
    g = torch.Generator().manual_seed(1000 * rank + step)
    x = torch.randn(256, 64, generator=g)
    return x.to(device), (x[:, :8].sum(dim=1, keepdim=True) * 0.5).to(device)


if MODE == "ddp":
    model, ddp, opt = build()
    for step in range(60):
        x, y = batch(step)
        loss = torch.nn.functional.mse_loss(ddp(x), y)
        opt.zero_grad(); loss.backward(); opt.step()
        if step in (0, 59):
            print(f"rank {rank} step {step} loss {loss.item():.5f} param_device {next(model.parameters()).device}", flush=True)
    dist.barrier()
elif MODE == "stall":
    print(f"rank {rank} entering a long CUDA kernel", flush=True)
    if CPU:
        time.sleep(3600)  # GPU_CHECK_STALL_LINE
    else:
        torch.cuda._sleep(int(2e12)); torch.cuda.synchronize()  # GPU_CHECK_STALL_LINE
elif MODE == "sigterm":
    done = Path(os.environ["GPU_CHECK_MARK"])
    a = torch.randn(4096, 4096, device=device)
    def on_term(signum, frame):
        t0 = time.monotonic()
        sync()
        torch.save({"a": a[:4].cpu()}, done.parent / f"save-{rank}.pt")
        time.sleep(float(os.environ.get("GPU_CHECK_SAVE_S", "2")))
        done.write_text(f"{time.time()} {time.monotonic() - t0:.3f}")
        print(f"rank {rank} saved on SIGTERM", flush=True)
        sys.exit(143)
    signal.signal(signal.SIGTERM, on_term)
    print(f"rank {rank} in GPU work", flush=True)
    while True:
        for _ in range(20):
            a = torch.tanh(a @ a) * 0.01 + a
        sync()
elif MODE == "restart":
    ckpt = Path(os.environ["SM_CHECKPOINT_DIR"] if os.environ.get("SM_CHECKPOINT_DIR") else "/opt/ml/checkpoints") / "last.pt"
    ckpt = Path(os.environ.get("GPU_CHECK_CKPT", ckpt))
    model, ddp, opt = build()
    start = 0
    if ckpt.exists():
        state = torch.load(ckpt, map_location=device)
        model.load_state_dict(state["model"]); opt.load_state_dict(state["opt"]); start = state["step"] + 1
        print(f"rank {rank} resumed at step {start} on {next(model.parameters()).device}", flush=True)
    for step in range(start, 40):
        x, y = batch(step)
        loss = torch.nn.functional.mse_loss(ddp(x), y)
        opt.zero_grad(); loss.backward()
        if attempt == 0 and step == 20:
            sync()
            print(f"rank {rank} killed mid-step {step}", flush=True)
            os.kill(os.getpid(), signal.SIGKILL)
        opt.step()
        if rank == 0:
            torch.save({"model": model.state_dict(), "opt": opt.state_dict(), "step": step}, ckpt)
    print(f"rank {rank} finished at step 39 loss {loss.item():.5f} attempt {attempt}", flush=True)
    dist.barrier()
dist.destroy_process_group()
'''


def stall_lines() -> list[int]:
    """The script's lines where its rank blocks (train.py is SCRIPT as it is: line 1 is its first)."""
    return [n for n, text in enumerate(SCRIPT.split("\n"), start=1) if "GPU_CHECK_STALL_LINE" in text]


class Check:
    def __init__(self, name: str) -> None:
        self.name = name
        self.figures: dict = {}
        self.failures: list[str] = []

    def expect(self, ok: bool, what: str) -> None:
        if not ok:
            self.failures.append(what)

    def result(self) -> dict:
        return {"name": self.name, "passed": not self.failures, "failures": self.failures, **self.figures}


class Runner:
    def __init__(self, args) -> None:
        self.args = args
        self.out = Path(args.out)
        self.out.mkdir(parents=True, exist_ok=True)
        self.work = Path(tempfile.mkdtemp(prefix="gpu-check-"))
        self.log = open(self.out / "gpu_check.log", "w")  # noqa: SIM115 - closed at the end

    def write(self, text: str) -> None:
        self.log.write(text if text.endswith("\n") else text + "\n")
        self.log.flush()

    def job(self, name: str, mode: str, hps: dict | None = None) -> Path:
        base = self.work / name
        (base / "code").mkdir(parents=True)
        (base / "code" / "train.py").write_text(SCRIPT)
        config = base / "input" / "config"
        config.mkdir(parents=True)
        values = {"sagemaker_program": "train.py", "sagemaker_torch_distributed_enabled": "true", **(hps or {})}
        (config / "hyperparameters.json").write_text(json.dumps(values))
        host = self.host_name()
        (config / "resourceconfig.json").write_text(
            json.dumps({"current_host": host, "hosts": [host], "network_interface_name": "lo"}))
        (config / "inputdataconfig.json").write_text("{}")
        (base / "checkpoints").mkdir()
        return base

    @staticmethod
    def host_name() -> str:
        """The job's one host: this machine's name where it resolves (as algo-1 does on SageMaker), else localhost.

        torch's store is reached at MASTER_ADDR, the host's name: one that does not resolve keeps the
        ranks retrying until torch's own timeout.
        """
        import socket

        name = socket.gethostname()
        try:
            socket.getaddrinfo(name, None)
            return name
        except OSError:
            return "localhost"

    def env(self, base: Path, mode: str, **extra: str) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("SM_", "SAGEMAKER_", "TRAINING_TOOLKIT_"))}
        env.update({"SAGEMAKER_BASE_DIR": str(base), "TRAINING_TOOLKIT_PLATFORM": PLATFORM, "GPU_CHECK_MODE": mode,
                    "GPU_CHECK_CKPT": str(base / "checkpoints" / "last.pt"), "PYTHONUNBUFFERED": "1"})
        if self.args.cpu:
            env.update({"GPU_CHECK_CPU": "1", "TRAINING_TOOLKIT_NUM_GPUS": "1"})
        env.update(extra)
        return env

    def train(self, base: Path, env: dict[str, str], timeout: float, on_line=None) -> tuple[int, list[str], float]:
        """Run `train`; ``on_line(line, proc)`` sees each output line as it comes."""
        t0 = time.monotonic()
        proc = subprocess.Popen([self.args.train], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                start_new_session=True)
        lines: list[str] = []
        deadline = t0 + timeout
        assert proc.stdout is not None
        for line in proc.stdout:
            lines.append(line.rstrip("\n"))
            self.write(f"[{base.name} {time.monotonic() - t0:7.2f}] {line}")
            if on_line is not None:
                on_line(line, proc)
            if time.monotonic() > deadline:
                break
        try:
            rc = proc.wait(timeout=max(1.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            rc = proc.wait()
            lines.append(f"GPU_CHECK: train killed after {timeout} s")
        return rc, lines, time.monotonic() - t0

    def verdict(self, base: Path) -> dict:
        out = base / "output"
        failure = out / "failure"
        return {"success_file": (out / "success").exists(),
                "failure_file": failure.read_text()[:4000] if failure.exists() else None}

    def leftovers(self, base: Path) -> dict:
        """Processes still running the job's script, and what the GPU says is on it."""
        mine = []
        for proc in Path("/proc").iterdir():
            if not proc.name.isdigit():
                continue
            try:
                cmdline = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            except OSError:
                continue
            if str(base) in cmdline or "train.py" in cmdline:
                try:
                    environ = (proc / "environ").read_bytes()
                except OSError:
                    environ = b""
                if str(base).encode() in environ or str(base) in cmdline:
                    mine.append({"pid": int(proc.name), "cmdline": cmdline[:200]})
        return {"job_processes": mine, "gpu_apps": gpu_apps(), "gpu_memory_used_mib_after": gpu_memory_used()}

    # --- the checks ---------------------------------------------------------------------------------

    def probe(self) -> Check:
        check = Check("probe")
        from training_toolkit.core import hardware

        times = []
        for _ in range(50):
            t0 = time.perf_counter()
            hw = hardware.probe()
            times.append(time.perf_counter() - t0)
        times.sort()
        check.figures.update(probe_gpus=hw.num_gpus, probe_cpus=hw.num_cpus, probe_ms_median=round(times[25] * 1000, 3),
                             probe_ms_max=round(times[-1] * 1000, 3), gpus_by_driver=self.gpus)
        if not self.args.cpu:
            check.expect(hw.num_gpus == self.gpus, f"the probe counted {hw.num_gpus} GPUs, the driver {self.gpus}")
        base = self.job("plan", "ddp")
        proc = subprocess.run([self.args.toolkit, "plan", "--base-dir", str(base)], env=self.env(base, "ddp"),
                              capture_output=True, text=True, timeout=60)
        self.write(f"[plan] rc {proc.returncode}\n{proc.stdout}\n{proc.stderr}")
        check.figures["plan_rc"] = proc.returncode
        check.expect(proc.returncode == 0, f"plan exited {proc.returncode}: {proc.stderr[-500:]}")
        check.figures["plan_sm_num_gpus"] = _first(r'"?SM_NUM_GPUS"?\s*[:=]\s*"?(\d+)', proc.stdout)
        check.figures["plan_processes"] = len(re.findall(r'"LOCAL_RANK"', proc.stdout))
        want = 1 if self.args.cpu else self.gpus
        check.expect(check.figures["plan_sm_num_gpus"] == str(want),
                     f"plan's SM_NUM_GPUS is {check.figures['plan_sm_num_gpus']}, want {want}")
        check.expect(check.figures["plan_processes"] == want,
                     f"plan starts {check.figures['plan_processes']} processes, want {want}")
        return check

    def ddp(self) -> Check:
        check = Check("ddp")
        base = self.job("ddp", "ddp")
        rc, lines, wall = self.train(base, self.env(base, "ddp"), timeout=180)
        want = 1 if self.args.cpu else self.gpus
        starts = [line for line in lines if re.search(r"rank \d+/\d+ local_rank", line)]
        losses = {}
        for line in lines:
            m = re.search(r"rank (\d+) step (\d+) loss ([\d.]+) param_device (\S+)", line)
            if m:
                losses.setdefault(m.group(1), []).append((int(m.group(2)), float(m.group(3)), m.group(4)))
        check.figures.update(rc=rc, wall_s=round(wall, 2), ranks=starts, losses=losses, **self.verdict(base))
        check.expect(rc == 0, f"train exited {rc}")
        check.expect(len(starts) == want, f"{len(starts)} processes started, want {want}")
        for line in starts:
            m = re.search(r"local_rank (\d+) device (\S+) .*sm_num_gpus (\S+)", line)
            if m and not self.args.cpu:
                check.expect(m.group(2) == f"cuda:{m.group(1)}", f"not pinned to its GPU: {line}")
                check.expect(m.group(3) == str(self.gpus), f"SM_NUM_GPUS wrong: {line}")
        for rank, seen in losses.items():
            check.expect(len(seen) == 2 and seen[1][1] < seen[0][1], f"rank {rank}'s loss did not go down: {seen}")
            if not self.args.cpu:
                check.expect(all(d.startswith("cuda") for _, _, d in seen), f"rank {rank}'s model not on the GPU")
        check.expect(bool(losses), "no loss printed")
        return check

    def stall(self) -> Check:
        check = Check("stall")
        base = self.job("stall", "stall")
        env = self.env(base, "stall", TRAINING_TOOLKIT_STALL_TIMEOUT="15", TRAINING_TOOLKIT_STALL_STARTUP="120",
                       TRAINING_TOOLKIT_GRACE_PERIOD="10")
        seen: dict = {}

        def on_line(line: str, proc) -> None:
            if "entering a long CUDA kernel" in line and not seen:
                time.sleep(3)
                seen.update(gpu_apps=gpu_apps(), gpu_memory_used_mib=gpu_memory_used(), at=time.monotonic())
            if "the job stalled" in line:
                seen["declared"] = time.monotonic()

        rc, lines, wall = self.train(base, env, timeout=150, on_line=on_line)
        ended = time.monotonic()
        if "declared" in seen:
            seen["exit_after_declared_s"] = round(ended - seen["declared"], 2)
        seen.pop("at", None)
        seen.pop("declared", None)
        check.figures["during"] = seen
        verdict = self.verdict(base)
        # the one line that names the stall (the log's and the failure file's first): it must name the script's line
        summary = next((line for line in lines if "the job stalled" in line), "")
        want = [f"train.py:{n}" for n in stall_lines()]
        named = [w for w in want if w in summary]
        check.figures["summary"] = summary
        time.sleep(2)
        left = self.leftovers(base)
        check.figures.update(rc=rc, wall_s=round(wall, 2), stack_lines_wanted=want, stack_lines_named=named,
                             **verdict, **left)
        check.expect(rc == 124, f"train exited {rc}, want 124")
        check.expect(bool(named), f"the stall's line names none of {want}: {summary!r}")
        check.expect(not left["job_processes"], f"processes of the job left: {left['job_processes']}")
        check.expect(not self._ours_on_gpu(left), f"the GPU lists processes: {left['gpu_apps']}")
        return check

    def sigterm(self) -> Check:
        check = Check("sigterm")
        base = self.job("sigterm", "sigterm")
        mark = base / "handled"
        env = self.env(base, "sigterm", TRAINING_TOOLKIT_GRACE_PERIOD="30", GPU_CHECK_MARK=str(mark), GPU_CHECK_SAVE_S="2")
        sent: dict = {}

        def on_line(line: str, proc) -> None:
            if "in GPU work" in line and "at" not in sent:
                time.sleep(3)  # well into the loop of kernels
                sent["during"] = {"gpu_apps": gpu_apps(), "gpu_memory_used_mib": gpu_memory_used()}
                sent["at"] = time.time()
                os.kill(proc.pid, signal.SIGTERM)

        rc, lines, wall = self.train(base, env, timeout=120, on_line=on_line)
        verdict = self.verdict(base)
        handled = mark.read_text().split() if mark.exists() else None
        time.sleep(2)
        left = self.leftovers(base)
        check.figures.update(rc=rc, wall_s=round(wall, 2), handler_ran=handled is not None, during=sent.get("during"),
                             **verdict, **left)
        if handled and "at" in sent:
            check.figures["handler_done_after_sigterm_s"] = round(float(handled[0]) - sent["at"], 3)
            check.figures["handler_took_s"] = float(handled[1])
        check.expect("at" in sent, "the rank never reported GPU work")
        check.expect(rc == 143, f"train exited {rc}, want 143")
        check.expect(handled is not None, "the rank's SIGTERM handler did not finish")
        check.expect(any(base.glob("save-*.pt")), "the handler's save is missing")
        check.expect("SIGTERM" in (verdict["failure_file"] or ""), "the failure file does not name the stop")
        check.expect(not left["job_processes"], f"processes of the job left: {left['job_processes']}")
        check.expect(not self._ours_on_gpu(left), f"the GPU lists processes: {left['gpu_apps']}")
        return check

    def restart(self) -> Check:
        check = Check("restart")
        base = self.job("restart", "restart")
        env = self.env(base, "restart", TRAINING_TOOLKIT_MAX_RESTARTS="1", TRAINING_TOOLKIT_GRACE_PERIOD="10")
        rc, lines, wall = self.train(base, env, timeout=240)
        resumed = [line for line in lines if "resumed at step" in line]
        attempts = [line for line in lines if re.search(r"attempt 2 of 2", line)]
        finished = [line for line in lines if "finished at step 39" in line]
        check.figures.update(rc=rc, wall_s=round(wall, 2), resumed=resumed, attempt_lines=attempts, finished=finished,
                             **self.verdict(base))
        check.expect(rc == 0, f"train exited {rc}")
        check.expect(bool(attempts), "no 'attempt 2 of 2' line")
        check.expect(bool(resumed) and all("step 20" in line or "step 21" in line for line in resumed),
                     f"did not resume from the checkpoint of step 19/20: {resumed}")
        if not self.args.cpu:
            check.expect(all("cuda" in line for line in resumed), "resumed off the GPU")
        check.expect(len(finished) == (1 if self.args.cpu else self.gpus), f"finished lines: {finished}")
        return check

    def _ours_on_gpu(self, left: dict) -> bool:
        """Anything of the job still on the GPU: a process listed, or memory held beyond what was used before the checks."""
        if self.args.cpu:
            return False
        used = left["gpu_memory_used_mib_after"]
        return len(left["gpu_apps"]) > self.baseline_apps or (
            used is not None and self.baseline_memory is not None and used > self.baseline_memory + 64)

    def run(self, only: list[str]) -> int:
        self.gpus = 0 if self.args.cpu else count_gpus()
        self.baseline_apps = None if self.args.cpu else len(gpu_apps())
        self.baseline_memory = None if self.args.cpu else gpu_memory_used()
        results = {"machine": machine(self.args.cpu), "gpu_apps_before": self.baseline_apps,
                   "gpu_memory_used_mib_before": self.baseline_memory, "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                   "checks": []}
        for name in only:
            t0 = time.monotonic()
            try:
                check = getattr(self, name)()
            except Exception as exc:  # noqa: BLE001 - a check that broke is a failed check, the rest still run
                check = Check(name)
                check.expect(False, f"the check broke: {exc!r}")
            check.figures["check_s"] = round(time.monotonic() - t0, 2)
            results["checks"].append(check.result())
            self.write(f"== {name}: {'PASS' if not check.failures else 'FAIL ' + '; '.join(check.failures)}")
            print(f"{name:8} {'PASS' if not check.failures else 'FAIL'} {check.figures.get('check_s')} s "
                  f"{'; '.join(check.failures)}", flush=True)
        results["passed"] = all(c["passed"] for c in results["checks"])
        (self.out / "gpu_check.json").write_text(json.dumps(results, indent=2))
        shutil.rmtree(self.work, ignore_errors=True)
        return 0 if results["passed"] else 1


def _first(pattern: str, text: str):
    m = re.search(pattern, text)
    return m.group(1) if m else None


def count_gpus() -> int:
    try:
        out = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.TimeoutExpired):
        return 0
    return sum(1 for line in out.splitlines() if line.startswith("GPU "))


def gpu_apps() -> list[dict]:
    try:
        out = subprocess.run(["nvidia-smi", "--query-compute-apps=pid,process_name,used_memory", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.TimeoutExpired):
        return []
    apps = []
    for line in out.splitlines():
        parts = [p.strip() for p in line.split(",")]
        if parts and parts[0].isdigit():
            apps.append({"pid": int(parts[0]), "name": parts[1] if len(parts) > 1 else "", "memory": parts[-1]})
    return apps


def gpu_memory_used() -> int | None:
    """MiB in use on the first GPU, as the driver counts it (None without nvidia-smi)."""
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=memory.used", "--format=csv,noheader,nounits"],
                             capture_output=True, text=True, timeout=30).stdout.split()
        return int(out[0]) if out else None
    except (OSError, subprocess.TimeoutExpired, ValueError):
        return None


def machine(cpu: bool) -> dict:
    info: dict = {"python": sys.version.split()[0]}
    try:
        import torch

        info.update(torch=torch.__version__, cuda=torch.version.cuda,
                    nccl=".".join(map(str, torch.cuda.nccl.version())) if not cpu else None)
    except Exception as exc:  # noqa: BLE001
        info["torch"] = repr(exc)
    if not cpu:
        try:
            info["nvidia_smi"] = subprocess.run(
                ["nvidia-smi", "--query-gpu=name,driver_version,memory.total", "--format=csv,noheader"],
                capture_output=True, text=True, timeout=30).stdout.strip()
        except (OSError, subprocess.TimeoutExpired) as exc:
            info["nvidia_smi"] = repr(exc)
    info["kernel"] = os.uname().release
    return info


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", required=True)
    parser.add_argument("--train", default=shutil.which("train") or "train")
    parser.add_argument("--toolkit", default=shutil.which("training-toolkit") or "training-toolkit")
    parser.add_argument("--cpu", action="store_true", help="a dry run without a GPU (gloo, one process)")
    parser.add_argument("--only", nargs="*", default=["probe", "ddp", "stall", "sigterm", "restart"])
    args = parser.parse_args()
    return Runner(args).run(args.only)


if __name__ == "__main__":
    sys.exit(main())

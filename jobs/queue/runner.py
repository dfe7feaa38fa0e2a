"""The job runner: starts each job as `python -m jobs.train <job dir>/config.yaml --data-dir <data dir>`.

No shell, its own process group (so cancel reaches every child), stdout and stderr appended to
train.log (never a pipe the UI must drain). Jobs outlive the UI: a restarted runner finds running
jobs by pid and keeps watching them.

The queue is GPU-aware (jobs/io/gpus.py): jobs on disjoint GPU sets run at the same time, a job waits
(its `reason` says for what) until the GPUs it asks for are free of our other jobs and of other
processes' memory, and a job with several processes (or machines: its rendezvous) runs through torchrun
(jobs/launch.py). On a machine without GPUs at most `max_running` jobs run at a time. A Ray cluster job
waits for its cluster's free GPUs and CPUs instead, holding none here (jobs/queue/cluster_queue.py).
An evaluation (`python -m jobs.evaluate`) is queued and placed as a job is (jobs/queue/evaluations.py).

Claim, then spawn: a queued job is first moved to running in SQLite by one runner instance, which
records itself as the job's owner (`JobStore.claim`), and only the winner of that claim starts
the trainer, so two studios on one data dir never start a job twice. Any instance can finish a job
whose trainer has exited; the instance that spawned it also reaps it, so no zombies pile up.

The monitor thread survives every exception (logged to stderr, retried with back-off), and the
methods the UI calls restart it if it has died; one broken job never breaks a page that lists jobs.
"""
from __future__ import annotations

import shutil
import signal
import subprocess
import sys
import threading
import time
import traceback
from pathlib import Path

from jobs.io import gpus, paths
from jobs.io.layout import JobLayout, new_job_folder
from jobs.io.storage import PRIVATE_UMASK, as_storage_error, open_private, write_private_text
from jobs.launch import spec_launch_argv
from jobs.messages import say
from jobs.queue import cluster_queue, evaluations, placement, procs, removal, resume
from jobs.queue.outcome import outcome as _outcome, spawn_failure as _spawn_failure
from jobs.queue.runner_log import RunnerError, _guarded, _log, default_name
from jobs.spec import JobSpec, SpecError
from jobs.queue.store import JobRecord, JobState, JobStore

REPO_ROOT = Path(__file__).resolve().parents[2]
CANCEL_GRACE_S = 60.0
CLAIM_GRACE_S = 120.0  # a claim with no trainer after this long is abandoned (its owner hung or died)
MAX_BACKOFF_S = 30.0


class Runner:
    def __init__(self, data_dir: str | Path, python: str | None = None, max_running: int = 1):
        self.data_dir = paths.data_dir(data_dir)
        self.store = JobStore(self.data_dir / "jobs.sqlite")
        self.python = python or sys.executable
        self.max_running = max_running
        self.owner = procs.new_owner()
        self._children: dict[str, subprocess.Popen] = {}
        self._lock = threading.RLock()
        self._monitor: threading.Thread | None = None
        self._monitor_interval: float | None = None
        self._stop = threading.Event()
        self.monitor_restarts = 0
        self._placements: dict[str, gpus.Placement] = {}  # chosen by _choose, used by _spawn
        self._waiting: dict[str, str] = {}                 # queued job -> why it waits (changed ones)
        self.studio_gpu: placement.StudioGpuUse | None = None  # the studio's chat models (studio/app.py)
        self.clusters = cluster_queue.ClusterQueue()  # Ray clusters' free resources, for cluster jobs

    # ---- what the UI calls ----------------------------------------------------------------
    def preview_command(self, spec: JobSpec) -> tuple[str, list[str]]:
        """The YAML and argv that Start would run, without creating anything."""
        processes = gpus.planned_processes(spec.gpus, spec.processes)
        return spec.to_yaml(), self.command(JobLayout(spec.output_dir or "<job dir>"), processes, spec.to_dict())

    def command(self, layout: JobLayout, processes: int = 1, spec: dict | None = None) -> list[str]:
        """The trainer's argv for a job folder (the only place it is built): through torchrun
        (jobs.launch) when the job runs as several processes or on several machines (its rendezvous);
        for an evaluation, the evaluate CLI's (jobs/queue/evaluations.py)."""
        if (spec or {}).get("kind") == evaluations.KIND:
            return evaluations.command(self.python, layout.root, self.data_dir)
        return spec_launch_argv(self.python, processes, spec or {}) + ["-m", "jobs.train", str(layout.config),
                                                                       "--data-dir", str(self.data_dir)]

    def gpu_inventory(self) -> list[gpus.GpuInfo]:
        """This machine's GPUs, each with the names of our jobs running on it (for the Train tab)."""
        held: dict[int, list[str]] = {}
        for index, name in gpus.held_by_jobs(self.store.list(states=(JobState.RUNNING,))).items():
            held.setdefault(index, []).append(name)
        return gpus.inventory(held)

    def submit(self, spec: JobSpec, need_gb: float | None = None,
               continues: tuple[JobRecord, int] | None = None) -> JobRecord:
        """Validate, record and start (or queue) a job; `need_gb`: its predicted peak GPU memory
        (the fit check's), which the queue waits for (None: a whole GPU); `continues`: the done job
        (and its checkpoint's step) that this one trains further. Raises SpecError before anything
        exists, and a StorageError (one line: path, free space, fix) when the data dir cannot be
        written."""
        spec.validate()
        gpus.check_request(spec.gpus, spec.processes, gpus.read_gpus())
        spec.name = spec.name.strip() or default_name(spec)
        layout = None
        try:
            job_id, layout = new_job_folder(paths.jobs_dir(self.data_dir))
            spec.output_dir = str(layout.root)
            write_private_text(layout.config, spec.to_yaml())
            placement.write_need(layout.root, need_gb)
            if continues is not None:   # before the row exists: no runner can start it unseeded
                resume.seed_continuation(layout, *continues)
        except OSError as exc:
            if layout is not None:
                shutil.rmtree(layout.root, ignore_errors=True)
            raise as_storage_error(exc, layout.root if layout else paths.jobs_dir(self.data_dir)) from None
        record = self.store.add(job_id, spec.name, layout.root, spec.to_dict())
        self._reconcile_quietly()
        return self.store.get(job_id) or record

    def submit_evaluation(self, job_id: str, config: dict) -> JobRecord:
        """Queue an evaluation of the finished job `job_id`; `config`: a validated EvalConfig mapping."""
        record = evaluations.add(self.store, job_id, config)
        self._reconcile_quietly()
        return self.store.get(record.id) or record

    def cancel(self, job_id: str) -> bool:
        """Stop this one job: a queued one becomes cancelled and never starts (it stays listed until
        deleted); a running one gets SIGTERM, saves the adapter of its current step and exits; after
        a grace period its whole process group is killed. False when there was nothing to stop."""
        record = self.store.get(job_id)
        if record is None or record.finished:
            return False
        if self.store.transition(job_id, (JobState.QUEUED,), state=JobState.CANCELLED, finished_at=time.time(),
                                 reason="cancelled before it started"):
            return True
        record = self.store.get(job_id)  # claimed a moment ago by some runner: it is running now
        if record is None or record.state != JobState.RUNNING:
            return False
        try:
            write_private_text(JobLayout(record.job_dir).cancel_request, str(time.time()))
        except OSError as exc:  # the signal below still stops it; only the "cancelled" label is lost
            _log(f"job {job_id}: cannot record the cancel request: {exc}")
        if self._alive(record):  # with no pid yet, its starter sees the request right after spawning
            procs.signal_group(record.pid, signal.SIGTERM)
        threading.Thread(target=self._kill_after_grace, args=(job_id,), daemon=True).start()
        return True

    def start_anyway(self, job_id: str) -> bool:
        """Let a queued job start as soon as no job of ours holds its GPUs, whatever memory other
        processes hold. False when it is not queued (any more)."""
        record = self.store.get(job_id)
        if record is None or record.state != JobState.QUEUED:
            return False
        placement.mark_start_anyway(record.job_dir)
        self._reconcile_quietly()
        return True

    def resume(self, job_id: str, more_steps: int = 0) -> JobRecord:
        """The same job again, queued, from its newest checkpoint (jobs/queue/resume.py); RunnerError says why not."""
        try:
            resume.requeue(self.store, job_id, more_steps)
        except resume.ResumeError as exc:
            raise RunnerError(str(exc)) from None
        self._reconcile_quietly()
        return self.store.get(job_id)

    def train_more(self, job_id: str, more_steps: int) -> JobRecord:
        """A new job that trains a done job `more_steps` further from its final checkpoint, in a
        folder of its own (the done job's adapter is never overwritten); RunnerError says why not."""
        record = self.store.get(job_id)
        if record is None:
            raise RunnerError(f"there is no job {job_id}")
        try:
            spec, step = resume.continued_spec(record, more_steps)
        except (resume.ResumeError, SpecError) as exc:
            raise RunnerError(f"job {record.name!r} cannot train further: {exc}") from None
        return self.submit(spec, placement.read(record.job_dir)["need_gb"], continues=(record, step))

    def delete(self, job_id: str) -> bool:
        """Remove a finished or queued job and its folder (jobs/queue/removal.py); a running job is
        refused with a RunnerError; False when there is no such job."""
        return removal.delete_job(self.store, paths.jobs_dir(self.data_dir), job_id)

    def list_jobs(self) -> list[JobRecord]:
        """The jobs, newest first; evaluations are not jobs (`list_evaluations`)."""
        self._ensure_monitor()
        self._reconcile_quietly()
        return [r for r in self.store.list() if not evaluations.is_evaluation(r)]

    def list_evaluations(self, job_id: str) -> list[JobRecord]:
        """The queued, running and finished evaluations of one job, newest first."""
        self._reconcile_quietly()
        return evaluations.of_job(self.store, job_id)

    def get(self, job_id: str) -> JobRecord | None:
        self._ensure_monitor()
        self._reconcile_quietly()
        return self.store.get(job_id)

    # ---- the watcher ----------------------------------------------------------------------
    def start_monitor(self, interval_s: float = 1.0) -> None:
        """Watch jobs in the background so queued jobs start with no browser connected."""
        self._monitor_interval = interval_s
        if self._monitor and self._monitor.is_alive():
            return
        self._stop.clear()
        self._monitor = threading.Thread(target=self._watch, args=(interval_s,), daemon=True,
                                         name="fusetune-runner")
        self._monitor.start()

    def shutdown(self) -> None:
        """Stop watching. Running jobs keep running; a new Runner reattaches to them."""
        self._monitor_interval = None
        self._stop.set()
        if self._monitor:
            self._monitor.join(timeout=5)

    def _ensure_monitor(self) -> None:
        """Restart the monitor if it was started and has died (the watchdog the UI's calls run)."""
        monitor = self._monitor
        if self._monitor_interval is None or self._stop.is_set() or (monitor and monitor.is_alive()):
            return
        self.monitor_restarts += 1
        _log("the monitor thread had stopped; restarting it")
        self.start_monitor(self._monitor_interval)

    def _watch(self, interval_s: float) -> None:
        failures, wait_s = 0, interval_s
        while not self._stop.wait(wait_s):
            try:
                self.reconcile()
                failures, wait_s = 0, interval_s
            except Exception as exc:  # the monitor must outlive any failure (a full disk, a locked db)
                failures += 1
                wait_s = min(MAX_BACKOFF_S, interval_s * 2 ** failures)
                detail = traceback.format_exc() if failures == 1 else f"{type(exc).__name__}: {exc}"
                _log(f"monitor pass failed ({failures} in a row), retrying in {wait_s:.0f}s: {detail}")

    def _reconcile_quietly(self) -> None:
        """reconcile() for the UI's calls: a failure is logged, never raised into a page load."""
        try:
            self.reconcile()
        except Exception as exc:
            _log(f"could not update jobs: {type(exc).__name__}: {exc}")

    def reconcile(self) -> None:
        """Reap our exited children, finish jobs whose trainer has exited, then claim and start
        queued jobs while there is room. A failure on one job is logged and the others go on."""
        with self._lock:
            self._reap_children()
            for record in self.store.list(states=(JobState.RUNNING,)):
                _guarded(record, self._check_running)
            self.clusters.read(self.store.list(states=(JobState.QUEUED,)))  # HTTP: not inside the claim
            while (claimed := self.store.claim(self.owner, self._choose)) is not None:
                _guarded(claimed, self._spawn)
            self._note_waiting()

    def _choose(self, running: list[JobRecord], queued: list[JobRecord]) -> str | None:
        """The queued job to start now, decided inside the claim's transaction (so every instance
        sees the same running jobs): the oldest whose GPUs are free (jobs/io/gpus.py; without GPUs,
        while fewer than `max_running` run); the others wait, keeping the GPUs they ask for from
        later jobs. Touches no store: `_spawn` gets the placement, `_note_waiting` the reasons."""
        machine, held = gpus.read_gpus(), gpus.held_by_jobs(running)
        ours, releasable = placement.studio_share(self.studio_gpu) if machine else ({}, False)
        claimed: set[int] = set()
        # a Ray cluster job holds nothing here; an evaluation on a CPU-only machine takes no slot
        local = [r for r in running if not r.spec.get("cluster") and not evaluations.is_evaluation(r)]
        for record in queued:
            spec, asked = record.spec, placement.read(record.job_dir)
            if spec.get("cluster"):  # the Ray cluster's free resources decide; no local GPU is given
                decision = self.clusters.place(spec, running)
            else:
                demand = gpus.Demand(asked["need_gb"], ours, releasable, asked["start_anyway"])
                decision = gpus.place(spec.get("gpus", "auto"), spec.get("processes", 0), machine, held, claimed,
                                      demand=demand)
                if not machine and len(local) >= self.max_running and not evaluations.is_evaluation(record):
                    decision = gpus.Wait(say("wait_running_job"))
            if isinstance(decision, gpus.Placement):
                self._placements[record.id] = decision
                self._waiting.pop(record.id, None)
                return record.id
            claimed |= decision.claims
            if record.reason != decision.reason:
                self._waiting[record.id] = decision.reason
        return None

    def _note_waiting(self) -> None:
        """Tell each queued job why it waits (only where that changed)."""
        waiting, self._waiting = self._waiting, {}
        for job_id, reason in waiting.items():
            self.store.transition(job_id, (JobState.QUEUED,), reason=reason)

    def _reap_children(self) -> None:
        """Collect the exit status of every child of ours that has ended (so none stays a zombie),
        and forget those whose job another instance has already finished."""
        for job_id, child in list(self._children.items()):
            if child.poll() is None:
                continue
            record = self.store.get(job_id)
            if record is None or record.state != JobState.RUNNING or record.owner != self.owner:
                self._children.pop(job_id, None)

    def _check_running(self, record: JobRecord) -> None:
        if record.pid is None and record.id not in self._children:
            self._check_claim(record)
        elif not self._alive(record):
            self._finish(record)

    def _check_claim(self, record: JobRecord) -> None:
        """A running job with no trainer pid: its owner is spawning it, or died before it could."""
        if record.owner == self.owner:
            # We spawn under self._lock, which we hold: our spawn of it failed before it was recorded.
            self._fail(record, "its trainer could not be started; the studio's log says why")
            return
        age = time.time() - (record.started_at or 0)
        if not (procs.owner_gone(record.owner) or age > CLAIM_GRACE_S):
            return
        orphan = procs.find_trainer(record.job_dir)
        if orphan is not None:  # the trainer started; only its pid was never recorded
            self.store.transition(record.id, (JobState.RUNNING,), pid=orphan)
            return
        self.store.transition(record.id, (JobState.RUNNING,), state=JobState.FAILED, finished_at=time.time(),
                              reason=say("owner_stopped_before_start", owner=record.owner))

    def _spawn(self, record: JobRecord) -> None:
        """Start the trainer of a job this instance has just claimed."""
        layout = JobLayout(record.job_dir)
        if layout.cancel_request.exists():
            self._fail(record, "cancelled before it started", JobState.CANCELLED)
            return
        if record.reason:  # "waiting for ..." no longer holds
            self.store.transition(record.id, (JobState.RUNNING,), reason="")
        placed = self._placements.pop(record.id, None) or gpus.place_now(
            record.spec.get("gpus", "auto"), record.spec.get("processes", 0), gpus.read_gpus())[0]
        if placed.unload_chat and self.studio_gpu is not None:
            self._release_chat(record)
        argv = self.command(layout, placed.processes, record.spec)
        try:
            if evaluations.is_evaluation(record):
                evaluations.record_gpu(layout.root, placed)
            elif not record.spec.get("cluster"):
                gpus.record_placement(layout.config, placed)
            with open_private(evaluations.log_file(record), "ab") as log:
                proc = subprocess.Popen(argv, cwd=REPO_ROOT, env={**self._env(record), **placed.env()},
                                        stdin=subprocess.DEVNULL,
                                        stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
                                        umask=PRIVATE_UMASK)
        except (OSError, ValueError, subprocess.SubprocessError) as exc:
            self._fail(record, _spawn_failure(argv, layout, exc))
            return
        self._children[record.id] = proc
        if not self.store.set_pid(record.id, self.owner, proc.pid):
            # Another instance gave up on this claim meanwhile: a lost claim must not train.
            procs.signal_group(proc.pid, signal.SIGKILL)
            proc.wait()
            self._children.pop(record.id, None)
            _log(f"job {record.id}: claim lost while starting; its trainer was stopped")
        elif layout.cancel_request.exists():  # cancelled while we were spawning it
            procs.signal_group(proc.pid, signal.SIGTERM)

    def _release_chat(self, record: JobRecord) -> None:
        """Unload the Chat tab's models for this job (it was placed only because they give way)."""
        if not self.studio_gpu.release(f"job '{record.name}'"):
            _log(f"job {record.id}: the chat models could not be unloaded; starting it beside them")

    def _fail(self, record: JobRecord, reason: str, state: JobState = JobState.FAILED) -> None:
        if self.store.transition(record.id, (JobState.RUNNING,), state=state, reason=reason,
                                 finished_at=time.time()) and state == JobState.FAILED:
            try:
                with open_private(evaluations.log_file(record), "a", encoding="utf-8") as log:
                    log.write(f"fusetune: {reason}\n")
            except OSError:
                pass  # the reason is in the database, which is what the studio shows

    def _env(self, record: JobRecord) -> dict[str, str]:
        return procs.job_env(self.data_dir, record.id)

    def _alive(self, record: JobRecord) -> bool:
        child = self._children.get(record.id)
        if child is not None:
            return child.poll() is None
        return procs.is_trainer_of(record.pid, record.job_dir)

    def _finish(self, record: JobRecord) -> None:
        child = self._children.pop(record.id, None)
        code = child.returncode if child is not None else None
        procs.signal_group(record.pid, signal.SIGKILL)  # sweep any grandchildren the job left behind
        for partial in JobLayout(record.job_dir).partials():  # a trainer killed mid-save
            shutil.rmtree(partial, ignore_errors=True)
        state, reason = _outcome(record, code)
        self.store.transition(record.id, (JobState.RUNNING,), state=state, reason=reason, finished_at=time.time())

    def _kill_after_grace(self, job_id: str) -> None:
        deadline = time.time() + CANCEL_GRACE_S
        while time.time() < deadline:
            record = self.store.get(job_id)
            if record is None or record.finished or (record.pid and not self._alive(record)):
                break
            time.sleep(0.5)
        else:
            record = self.store.get(job_id)
            if record is not None and self._alive(record):
                procs.signal_group(record.pid, signal.SIGKILL)
        self._reconcile_quietly()

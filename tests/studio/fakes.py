"""Runner stand-ins for studio tests: a fixed list of JobRecords (newest first), and one that
records what Start submits."""
from jobs.queue.store import JobRecord


class ListRunner:
    def __init__(self, records):
        self.records = records

    def list_jobs(self):
        return list(self.records)

    def get(self, job_id):
        return next((r for r in self.records if r.id == job_id), None)


class RecordingRunner:
    def __init__(self):
        self.submitted = []

    def submit(self, spec, need_gb=None):
        self.submitted.append(spec)
        self.need_gb = need_gb
        return JobRecord(id="job-1", name="n", state="queued", created_at=0.0, job_dir="/x")

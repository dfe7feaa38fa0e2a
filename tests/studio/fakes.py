"""A runner stand-in for studio tests: a fixed list of JobRecords, newest first."""


class ListRunner:
    def __init__(self, records):
        self.records = records

    def list_jobs(self):
        return list(self.records)

    def get(self, job_id):
        return next((r for r in self.records if r.id == job_id), None)

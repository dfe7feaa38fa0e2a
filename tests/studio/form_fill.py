"""The Train form filled as a person would: its field names and their text values, for studio tests."""
from jobs.spec import JobSpec
from studio import form


def form_values(data_dir=None, **changes):
    """(names, values) of the Train form: JobSpec's defaults, then with `data_dir` the tiny model it holds and
    3 steps (a job of seconds), then `changes`, each as the form holds it."""
    names = form.form_names()
    values = form.spec_to_values(JobSpec(), names)
    tiny = {"model": str(data_dir / "models" / "tiny"), "max_steps": "3"} if data_dir is not None else {}
    for key, value in {**tiny, **changes}.items():
        values[names.index(key)] = value
    return names, values

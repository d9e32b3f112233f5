"""pipeline/measurement/machine_description.py: the machine benchmark.json names."""

from pipeline.measurement.machine_description import TIMED_LIBRARIES, machine_description


def test_the_machine_names_its_cpu_cores_python_and_every_timed_library():
    machine = machine_description()
    assert set(machine) == {"cpu", "cpu_flags", "cores", "python", "versions"}
    assert list(machine["versions"]) == list(TIMED_LIBRARIES) and machine["versions"]["onnxruntime"]
    assert machine["cores"] >= 1 and machine["python"].count(".") == 2

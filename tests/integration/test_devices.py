"""GPU discovery through the simulated NVML when one GPU fails: the others are still listed.

The simulated NVML takes faults from SIMGPU_NVML_FAULTS at every nvmlInit (`1:lost`: every query
of GPU 1 answers GPU_IS_LOST; `0:no_permission`: GPU 0's handle answers NO_PERMISSION, as a GPU
outside a container's devices does), so one process can turn a fault on and off between
listings, as a GPU falling off the bus and coming back would.
"""

from __future__ import annotations

from conftest import Sim, python


def test_a_lost_gpu_is_left_out_and_the_others_listed(sim_factory) -> None:  # type: ignore[no-untyped-def]
    sim = sim_factory(gpus=3)
    uuids = sim.uuids()
    values, proc = python(
        sim.env(SIMGPU_NVML_FAULTS="1:lost"),
        """
        import logging, sys
        logging.basicConfig(stream=sys.stderr, level=logging.INFO, format="%(levelname)s %(message)s")
        from sharegpu.devices import busy_by_pid, processes_by_gpu, scan_gpus
        for _ in range(2):  # said once while it lasts
            listing = scan_gpus()
        print("indexes=" + ",".join(str(g.index) for g in listing.gpus))
        print("faults=" + ";".join(f"{f.index}:{f.error}:{f.no_permission}" for f in listing.faults))
        print("processes=" + ",".join(sorted(processes_by_gpu())))
        print("busy=" + ",".join(sorted(busy_by_pid())))
        """,
    )
    assert proc.returncode == 0, proc.stderr
    assert values["indexes"] == "0,2"
    assert values["faults"] == "1:GPU is lost:False"
    assert values["processes"] == ",".join(sorted([uuids[0], uuids[2]]))
    assert values["busy"] == ",".join(sorted([uuids[0], uuids[2]]))
    warnings = [line for line in proc.stderr.splitlines() if line.startswith("WARNING")]
    assert warnings == ["WARNING GPU 1: NVML cannot query it (GPU is lost); left out"], proc.stderr


def test_a_gpu_that_comes_back_is_listed_again(sim: Sim) -> None:
    values, proc = python(
        sim.env(),
        """
        import logging, os, sys
        logging.basicConfig(stream=sys.stderr, level=logging.INFO, format="%(levelname)s %(message)s")
        from sharegpu.devices import gpu_processes, list_gpus
        from sharegpu.errors import DeviceError
        uuids = [g.uuid for g in list_gpus()]
        os.environ["SIMGPU_NVML_FAULTS"] = "0:lost"
        print("lost=" + ",".join(str(g.index) for g in list_gpus()))
        try:
            gpu_processes(uuids[0])
            print("asked=answered")
        except DeviceError as err:
            print(f"asked={err}")
        del os.environ["SIMGPU_NVML_FAULTS"]
        print("back=" + ",".join(str(g.index) for g in list_gpus()))
        """,
    )
    assert proc.returncode == 0, proc.stderr
    assert values["lost"] == "1"
    assert values["asked"] == "NVML query failed: GPU is lost"  # asked by name: an error, not []
    assert values["back"] == "0,1"
    assert "INFO GPU 0 answers NVML again" in proc.stderr


def test_a_gpu_outside_the_container_is_left_out_quietly(sim: Sim) -> None:
    values, proc = python(
        sim.env(SIMGPU_NVML_FAULTS="0:no_permission"),
        """
        import logging, sys
        logging.basicConfig(stream=sys.stderr, level=logging.INFO, format="%(levelname)s %(message)s")
        from sharegpu.devices import processes_by_gpu, scan_gpus
        listing = scan_gpus()
        print("indexes=" + ",".join(str(g.index) for g in listing.gpus))
        print("faults=" + ";".join(f"{f.index}:{f.no_permission}" for f in listing.faults))
        print("processes=" + str(len(processes_by_gpu())))
        """,
    )
    assert proc.returncode == 0, proc.stderr
    assert values["indexes"] == "1"
    assert values["faults"] == "0:True"
    assert values["processes"] == "1"
    assert "WARNING" not in proc.stderr  # routine in a container given some of the GPUs


def test_a_malformed_fault_list_is_a_clear_error(sim: Sim) -> None:
    for faults, words in (
        ("1:melted", "unknown fault melted (lost or no_permission)"),
        ("lost", "expected <index>:lost or <index>:no_permission"),
        ("99:lost", "with an index below"),
    ):
        values, proc = python(
            sim.env(SIMGPU_NVML_FAULTS=faults),
            """
            from sharegpu.devices import list_gpus
            from sharegpu.errors import DeviceError
            try:
                list_gpus()
                print("listed=yes")
            except DeviceError as err:
                print(f"error={err}")
            """,
        )
        assert proc.returncode == 0, proc.stderr
        assert values["error"].startswith("NVML is not available"), values
        assert words in proc.stderr, (faults, proc.stderr)


def test_faults_can_come_from_a_file_that_may_not_exist(sim: Sim, tmp_path) -> None:  # type: ignore[no-untyped-def]
    faults = tmp_path / "faults"
    code = """
        from sharegpu.devices import list_gpus
        from sharegpu.errors import DeviceError
        try:
            print("indexes=" + ",".join(str(g.index) for g in list_gpus()))
        except DeviceError as err:
            print(f"error={err}")
        """
    env = sim.env(SIMGPU_NVML_FAULTS=f"@{faults}")
    values, proc = python(env, code)  # no file: no fault
    assert values["indexes"] == "0,1", proc.stderr
    faults.write_text("0:lost\n")
    values, proc = python(env, code)
    assert values["indexes"] == "1", proc.stderr
    faults.write_text("0:gone\n")
    values, proc = python(env, code)
    assert values["error"].startswith("NVML is not available"), values
    assert "unknown fault gone" in proc.stderr

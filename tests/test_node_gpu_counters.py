"""The GPUs' error counters (trainer/runtime/gpu_counters.py) from the vendor tools' real output formats, and which
tool is asked (nvidia-smi; amd-smi before rocm-smi), with fake tools on PATH. No GPU: milliseconds."""
from __future__ import annotations

import json

from trainer.runtime import gpu_counters

# nvidia-smi --query-gpu=index,pci.bus_id,ecc.errors.uncorrected.volatile.total,retired_pages.pending
# --format=csv,noheader,nounits: ", "-separated cells; "[N/A]" where the GPU lacks the field (retired pages on a
# GPU that remaps rows), "[Not Supported]" where the driver does not report it (the forms real captures show, e.g.
# `nvidia-smi --format=csv,noheader,nounits --query-gpu=module.power.draw.average` -> `[N/A]`).
NVIDIA = "0, 00000000:18:00.0, 0, [N/A]\n1, 00000000:2A:00.0, 3, No\n2, 00000000:3A:00.0, [Not Supported], Yes\n"
# nvidia-smi --query-remapped-rows=gpu_bus_id,remapped_rows.failure,remapped_rows.pending --format=csv,noheader,
# nounits (NVIDIA's A100/H100 memory error management guide: failure and pending read Yes/No or 1/0)
REMAPPED = "00000000:18:00.0, No, 0\n00000000:2A:00.0, 0, 0\n00000000:3A:00.0, 1, Yes\n"
# `amd-smi metric --json` on a Radeon RX 6600 (amdgpu 7.0.0-3-pve), the GPU's `ecc` object verbatim from a user's
# capture: the ROCm 6 shape, a list of per-GPU objects (amdsmi_cli/amdsmi_logger.py _print_json_output)
AMD_ROCM6 = json.dumps([{"gpu": 0, "ecc": {
    "total_correctable_count": 0, "total_uncorrectable_count": 0, "total_deferred_count": 0,
    "cache_correctable_count": "N/A", "cache_uncorrectable_count": "N/A"}, "ecc_blocks": "N/A"}], indent=4)
# ROCm 7's amd-smi wraps the list: {"gpu_data": [...]} (the key amdsmi_commands.py `metric` fills per GPU: `ecc`
# with total_correctable_count / total_uncorrectable_count / total_deferred_count / cache_*_count)
AMD_ROCM7 = json.dumps({"gpu_data": [
    {"gpu": 0, "ecc": {"total_correctable_count": 5, "total_uncorrectable_count": 0, "total_deferred_count": 1}},
    {"gpu": 1, "ecc": {"total_correctable_count": "N/A", "total_uncorrectable_count": 2}}]})
# `sudo rocm-smi --showrasinfo` on MI50s, verbatim (https://arkprojects.space/wiki/AMD_GFX906/perf-tuning), GPU[1]
# made up in the same layout (rocm_smi.py showRasInfo -> printTableLog: "GPU[%s]: \t" + "RAS INFO", the headers,
# each cell right-aligned to its header's width; a block whose counts could not be read has none)
ROCM_SMI = """\
========================= ROCm System Management Interface =========================
===================================== RAS Info =====================================

GPU[0]:         RAS INFO
         Block       Status    Correctable Error  Uncorrectable Error  
           UMC        ENABLED                  0                    0  
          SDMA        ENABLED                  0                    0  
           GFX        ENABLED                  0                    0  
         MMHUB        ENABLED                  0                    0  
         ATHUB        ENABLED  
      PCIE_BIF        ENABLED                  0                    0  
           HDP        ENABLED                  0                    0  
     XGMI_WAFL       DISABLED  
            DF        ENABLED  
           SMN        ENABLED  
           SEM        ENABLED  
           MP0        ENABLED  
           MP1        ENABLED  
          FUSE        ENABLED  
____________________________________________________________________________________

GPU[1]: \tRAS INFO
         Block       Status    Correctable Error  Uncorrectable Error  
           UMC        ENABLED                 12                    2  
          SDMA       DISABLED            3145680              3145680  
____________________________________________________________________________________
"""


def test_nvidia_fields_and_remapped_rows_join_on_the_bus_id():
    found = gpu_counters.nvidia(NVIDIA)
    assert found == {0: {"ecc.errors.uncorrected.volatile.total": 0.0},
                     1: {"ecc.errors.uncorrected.volatile.total": 3.0, "retired_pages.pending": 0.0},
                     2: {"retired_pages.pending": 1.0}}
    gpu_counters.remapped(REMAPPED, gpu_counters.bus_ids(NVIDIA), found)
    assert found[0] == {"ecc.errors.uncorrected.volatile.total": 0.0, "remapped_rows.failure": 0.0,
                        "remapped_rows.pending": 0.0}
    assert gpu_counters.bad({0: found[0]}) is None
    assert gpu_counters.bad(found) == "GPU 1: ecc.errors.uncorrected.volatile.total 3"
    assert gpu_counters.bad({2: found[2]}) == ("GPU 2: remapped_rows.failure 1, remapped_rows.pending 1, "
                                               "retired_pages.pending 1")


def test_amd_smi_both_shapes_and_rocm_smi_text():
    assert gpu_counters.amd(AMD_ROCM6) == {0: {"total_uncorrectable_count": 0.0}}
    assert gpu_counters.amd(AMD_ROCM7) == {0: {"total_uncorrectable_count": 0.0},
                                           1: {"total_uncorrectable_count": 2.0}}
    assert gpu_counters.amd("WARNING: no GPU") == {} and gpu_counters.amd('{"x": 1}') == {}
    found = gpu_counters.rocm(ROCM_SMI)
    assert found[0] == {f"{b} uncorrectable": 0.0 for b in ("UMC", "SDMA", "GFX", "MMHUB", "PCIE_BIF", "HDP")}
    assert found[1] == {"UMC uncorrectable": 2.0}  # the disabled block's figures mean nothing
    assert gpu_counters.bad(found) == "GPU 1: UMC uncorrectable 2"


def _tool(folder, name, script):
    """A fake tool; PATH holds only these, so shell builtins only (`echo`, not `cat`)."""
    path = folder / name
    path.write_text("#!/bin/sh\n" + script)
    path.chmod(0o755)


def test_the_tools_asked_and_a_field_the_driver_lacks(tmp_path, monkeypatch):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    monkeypatch.setenv("PATH", str(bin_dir))
    assert gpu_counters.counters() == (None, {}, "no nvidia-smi, amd-smi or rocm-smi on PATH: GPU error counters "
                                                 "skipped")
    (tmp_path / "ras.txt").write_text(ROCM_SMI)
    _tool(bin_dir, "rocm-smi", f"while IFS= read -r l; do echo \"$l\"; done < {tmp_path / 'ras.txt'}\n")
    assert gpu_counters.counters()[:2] == ("rocm-smi", gpu_counters.rocm(ROCM_SMI))
    _tool(bin_dir, "amd-smi", f"[ \"$*\" = 'metric --ecc --json' ] || exit 2\necho '{AMD_ROCM7}'\n")
    assert gpu_counters.counters()[:2] == ("amd-smi", gpu_counters.amd(AMD_ROCM7))  # amd-smi first
    # a driver that does not know retired_pages.pending: the combined query fails, each field is asked alone
    _tool(bin_dir, "nvidia-smi", """case "$*" in
  *remapped-rows*) printf '00000000:18:00.0, Yes, No\\n' ;;
  *ecc.errors*retired*) echo 'Field "retired_pages.pending" is not a valid field to query.'; exit 2 ;;
  *retired_pages*) echo 'Field "retired_pages.pending" is not a valid field to query.'; exit 2 ;;
  *ecc.errors*) printf '0, 00000000:18:00.0, 0\\n' ;;
esac
""")
    tool, found, note = gpu_counters.counters()
    assert tool == "nvidia-smi" and note == "nvidia-smi could not read retired_pages.pending"
    assert found == {0: {"ecc.errors.uncorrected.volatile.total": 0.0, "remapped_rows.failure": 1.0,
                         "remapped_rows.pending": 0.0}}

"""Network bandwidth of a Google Cloud worker VM: by machine family, GPU model and GPU count.

One table, from Google Cloud's Compute Engine documentation:
  * "Network bandwidths and GPUs" (now titled "Networking and GPU machines",
    https://cloud.google.com/compute/docs/gpus/gpu-network-bandwidth): N1 VMs with T4 or V100 GPUs
    get up to 100 Gbps depending on GPU count and vCPU count (10 Gbps with 5 vCPUs or fewer, else
    min(2 Gbps x vCPUs, the GPU-count cap below)); N1 VMs with P100 or P4 GPUs keep the N1 cap of
    32 Gbps; A2 and G2 get up to 100 Gbps by machine type; rates >= 50 Gbps need gVNIC.
  * "GPU machine types" (https://cloud.google.com/compute/docs/gpus): the maximum network
    bandwidth of every A2/A3/G2 machine type, and the vCPU counts N1 allows per GPU count.
  * N1/N2 without GPUs: the default per-VM egress cap, 2 Gbps per vCPU, at most 32 Gbps.
Anything else (other families, GPU models or counts) is refused: the caller must give the
bandwidth (`--worker-gbps`) instead of this module guessing it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from ..errors import ConfigError

SOURCE = 'Google Cloud, "Network bandwidths and GPUs" / "GPU machine types"'


@dataclass(frozen=True)
class FixedGpuMachine:
    """An accelerator-optimized machine type: its GPUs come with it."""

    accelerator: str
    count: int
    gbps: float
    note: str = ""


# Accelerator-optimized machine types: GPU model and count are part of the type.
# a3-highgpu-8g: 1,000 Gbps in total, but 800 of it are the four GPU NICs that only
# GPUDirect-TCPX uses; TCP traffic such as a reducer's has the one 200 Gbps gVNIC.
FIXED_GPU_MACHINES: dict[str, FixedGpuMachine] = {
    "a2-highgpu-1g": FixedGpuMachine("NVIDIA_TESLA_A100", 1, 24),
    "a2-highgpu-2g": FixedGpuMachine("NVIDIA_TESLA_A100", 2, 32),
    "a2-highgpu-4g": FixedGpuMachine("NVIDIA_TESLA_A100", 4, 50),
    "a2-highgpu-8g": FixedGpuMachine("NVIDIA_TESLA_A100", 8, 100),
    "a2-megagpu-16g": FixedGpuMachine("NVIDIA_TESLA_A100", 16, 100),
    "a2-ultragpu-1g": FixedGpuMachine("NVIDIA_A100_80GB", 1, 24),
    "a2-ultragpu-2g": FixedGpuMachine("NVIDIA_A100_80GB", 2, 32),
    "a2-ultragpu-4g": FixedGpuMachine("NVIDIA_A100_80GB", 4, 50),
    "a2-ultragpu-8g": FixedGpuMachine("NVIDIA_A100_80GB", 8, 100),
    "a3-highgpu-1g": FixedGpuMachine("NVIDIA_H100_80GB", 1, 25),
    "a3-highgpu-2g": FixedGpuMachine("NVIDIA_H100_80GB", 2, 50),
    "a3-highgpu-4g": FixedGpuMachine("NVIDIA_H100_80GB", 4, 100),
    "a3-highgpu-8g": FixedGpuMachine(
        "NVIDIA_H100_80GB", 8, 200, "the general-purpose gVNIC; the 4 GPU NICs carry GPUDirect-TCPX only"
    ),
    "g2-standard-4": FixedGpuMachine("NVIDIA_L4", 1, 10),
    "g2-standard-8": FixedGpuMachine("NVIDIA_L4", 1, 16),
    "g2-standard-12": FixedGpuMachine("NVIDIA_L4", 1, 16),
    "g2-standard-16": FixedGpuMachine("NVIDIA_L4", 1, 32),
    "g2-standard-24": FixedGpuMachine("NVIDIA_L4", 2, 32),
    "g2-standard-32": FixedGpuMachine("NVIDIA_L4", 1, 32),
    "g2-standard-48": FixedGpuMachine("NVIDIA_L4", 4, 50),
    "g2-standard-96": FixedGpuMachine("NVIDIA_L4", 8, 100),
}

# N1 + GPUs: (GPU model, GPU count) -> (bandwidth cap in Gbps, most vCPUs N1 allows with it).
# The vCPU limits were checked against a stored copy of "GPU machine types"; the per-count caps
# of T4/V100 (and the 10 Gbps rule for <= 5 vCPUs) are the "Network bandwidths and GPUs" table
# as we know it: its overview (up to 100 Gbps by GPU and vCPU count) was checked, the table rows
# could not be re-read here. Check them before relying on a 2- or 4-GPU figure.
# T4/V100: the cap grows with the GPU count; P100/P4: the N1 default cap of 32 Gbps.
# (P100 x 4 allows 96 vCPUs in most zones, 64 in a few.)
N1_GPUS: dict[tuple[str, int], tuple[float, int]] = {
    ("NVIDIA_TESLA_V100", 1): (32, 12),
    ("NVIDIA_TESLA_V100", 2): (32, 24),
    ("NVIDIA_TESLA_V100", 4): (50, 48),
    ("NVIDIA_TESLA_V100", 8): (100, 96),
    ("NVIDIA_TESLA_T4", 1): (32, 48),
    ("NVIDIA_TESLA_T4", 2): (50, 48),
    ("NVIDIA_TESLA_T4", 4): (100, 96),
    ("NVIDIA_TESLA_P100", 1): (32, 16),
    ("NVIDIA_TESLA_P100", 2): (32, 32),
    ("NVIDIA_TESLA_P100", 4): (32, 96),
    ("NVIDIA_TESLA_P4", 1): (32, 24),
    ("NVIDIA_TESLA_P4", 2): (32, 48),
    ("NVIDIA_TESLA_P4", 4): (32, 96),
}
N1_FEW_VCPUS = 5  # T4/V100 VMs with this many vCPUs or fewer get N1_FEW_VCPUS_GBPS
N1_FEW_VCPUS_GBPS = 10.0
GBPS_PER_VCPU = 2.0  # N1/N2 default egress cap per vCPU ...
GENERAL_PURPOSE_CAP = 32.0  # ... and per VM

_GENERAL_PURPOSE = re.compile(r"^(n1|n2)-(standard|highmem|highcpu)-(\d+)$")


@dataclass(frozen=True)
class WorkerBandwidth:
    gbps: float
    reason: str  # which rule gave the figure, for the user to check


def _unknown(what: str) -> ConfigError:
    return ConfigError(
        f"{what}; this tool will not guess a worker's network bandwidth: pass --worker-gbps (or --reducers)"
    )


def worker_bandwidth(
    machine_type: str, accelerator_type: str | None = None, accelerator_count: int = 1
) -> WorkerBandwidth:
    """The per-VM network bandwidth of a worker, with the rule that gave it (ConfigError if unknown)."""
    fixed = FIXED_GPU_MACHINES.get(machine_type)
    if fixed is not None:
        if accelerator_type and (accelerator_type, accelerator_count) != (fixed.accelerator, fixed.count):
            raise ConfigError(
                f"{machine_type} comes with {fixed.count} x {fixed.accelerator}, not "
                f"{accelerator_count} x {accelerator_type}"
            )
        note = f"; {fixed.note}" if fixed.note else ""
        return WorkerBandwidth(
            fixed.gbps, f"{machine_type} ({fixed.count} x {fixed.accelerator}) has {fixed.gbps:g} Gbps{note} ({SOURCE})"
        )
    m = _GENERAL_PURPOSE.match(machine_type)
    if m is None:
        raise _unknown(
            f"unknown worker machine type {machine_type!r} (known: n1-*/n2-* standard, highmem, "
            f"highcpu and {', '.join(FIXED_GPU_MACHINES)})"
        )
    family, vcpus = m.group(1), int(m.group(3))
    default = min(GBPS_PER_VCPU * vcpus, GENERAL_PURPOSE_CAP)
    if not accelerator_type:
        return WorkerBandwidth(
            default,
            f"{machine_type} without GPUs: {GBPS_PER_VCPU:g} Gbps per vCPU, at most {GENERAL_PURPOSE_CAP:g} ({SOURCE})",
        )
    if family != "n1":
        raise ConfigError(f"GPUs attach to N1 general-purpose VMs only, not {machine_type}")
    entry = N1_GPUS.get((accelerator_type, accelerator_count))
    if entry is None:
        known = sorted({f"{g} x {c}" for g, c in N1_GPUS})
        raise _unknown(
            f"no bandwidth rule for {machine_type} with {accelerator_count} x {accelerator_type} "
            f"(known N1 combinations: {', '.join(known)})"
        )
    cap, max_vcpus = entry
    if vcpus > max_vcpus:
        raise ConfigError(
            f"N1 with {accelerator_count} x {accelerator_type} allows at most {max_vcpus} vCPUs; "
            f"{machine_type} has {vcpus}"
        )
    gpus = f"{machine_type} + {accelerator_count} x {accelerator_type}"
    if accelerator_type in ("NVIDIA_TESLA_V100", "NVIDIA_TESLA_T4"):
        if vcpus <= N1_FEW_VCPUS:
            return WorkerBandwidth(
                N1_FEW_VCPUS_GBPS,
                f"{gpus}: N1 with T4/V100 and <= {N1_FEW_VCPUS} vCPUs has {N1_FEW_VCPUS_GBPS:g} Gbps ({SOURCE})",
            )
        gbps = min(GBPS_PER_VCPU * vcpus, cap)
        return WorkerBandwidth(
            gbps,
            f"{gpus}: N1 with T4/V100 GPUs has min({GBPS_PER_VCPU:g} Gbps x {vcpus} vCPUs, "
            f"{cap:g} Gbps for {accelerator_count} GPUs) = {gbps:g} Gbps, with gVNIC "
            f"above 32 ({SOURCE})",
        )
    return WorkerBandwidth(
        default,
        f"{gpus}: N1 with P100/P4 GPUs keeps the N1 cap, min({GBPS_PER_VCPU:g} Gbps "
        f"x {vcpus} vCPUs, {GENERAL_PURPOSE_CAP:g}) = {default:g} Gbps ({SOURCE})",
    )

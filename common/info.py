"""`python -m common.info`: the machine, framework-free (the hardware review of `make info`)."""

import os

from common import devices, results


def main() -> None:
    caps = ", ".join(f"{k}={v}" for k, v in devices.isa_caps().items())
    isa = devices.cpu_isa() + (f", capped: {caps}" if caps else "")
    bf16 = "bf16 arithmetic" if devices.cpu_has_bf16() else "no bf16 arithmetic"
    print(f"cpu: {results.cpu_model()} ({os.cpu_count()} cores, ISA {isa}, {bf16})")
    gpus = results.gpu_details()
    if not gpus:
        print("gpus: none (multi-device runs use virtual CPU devices)")
    for i, gpu in enumerate(gpus):
        print(f"gpu {i}: {gpu['name']}, {gpu['memory']}, driver {gpu['driver']}")
    print(f"accelerators visible: {devices.count_accelerators()}")
    print(f"git commit: {results.git_commit()}")


if __name__ == "__main__":
    main()

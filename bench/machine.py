"""What a benchmark prints about the machine it ran on: the CPU model (the
library's kernel level comes from pqcache.cpu_level())."""

import platform


def cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"

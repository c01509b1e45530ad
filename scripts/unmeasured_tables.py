"""List the declared benchmark tables (every family's BENCHMARKS) that have no committed results in
results/, with the command that measures them on a GPU. `make tables` runs it; the test suite prints
the same list at its end (it does not fail on it).

    python scripts/unmeasured_tables.py
"""
import attention_kernels  # noqa: F401  (the interpreter on a CPU, before Triton is imported)
from attention_kernels.bench import measure_command, unmeasured

if __name__ == "__main__":
    names = unmeasured()
    if names:
        print(f"{len(names)} declared table(s) not measured yet: {', '.join(names)}")
        print(f"measure them on a GPU: {measure_command(names)}")
    else:
        print("every declared table has committed results")

"""List the declared tables (every family's BENCHMARKS, and the tables a script of their own writes: its
SCRIPT_TABLES) that have no committed results in results/, with the commands that measure them on a GPU.
`make tables` runs it; the test suite prints the same list at its end (it does not fail on it).

    python scripts/unmeasured_tables.py
"""
import attention_kernels  # noqa: F401  (the interpreter on a CPU, before Triton is imported)
from attention_kernels.bench import measure_commands, unmeasured

if __name__ == "__main__":
    names = unmeasured()
    if names:
        print(f"{len(names)} declared table(s) not measured yet: {', '.join(names)}")
        print("measure them on a GPU: " + "; ".join(measure_commands(names)))
    else:
        print("every declared table has committed results")

# The compiled module of fastdata/_lookup.c (optional: absent where no C compiler was found).
import numpy as np

def planes(
    source: np.ndarray, tables: np.ndarray, out: np.ndarray, channels: int, interleaved: bool, /
) -> None: ...

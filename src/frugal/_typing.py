"""Array type aliases shared by frugal's modules (annotations only).

`F32` is a numpy array of float32, `I64` of int64, and so on; the shape is given in each
function's docstring, as numpy's typing cannot express it.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

__all__ = ["F32", "F64", "I32", "I64", "U64", "Bool"]

F32 = npt.NDArray[np.float32]
F64 = npt.NDArray[np.float64]
I32 = npt.NDArray[np.int32]
I64 = npt.NDArray[np.int64]
U64 = npt.NDArray[np.uint64]
Bool = npt.NDArray[np.bool_]

"""scikit-learn's bundled data sets: shipped inside the sklearn package, so they load offline."""

from __future__ import annotations

import numpy as np
import sklearn.datasets

BUNDLED_SKLEARN = ("digits", "iris", "wine", "breast_cancer", "diabetes", "linnerud")


def load_bundled(name: str) -> tuple[np.ndarray, np.ndarray]:
    """`(X, y)` from `sklearn.datasets.load_<name>`, e.g. `load_bundled("digits")` -> (1797, 64), (1797,)."""
    if name not in BUNDLED_SKLEARN:
        raise ValueError(
            f"unknown bundled data set {name!r}; available: {', '.join(BUNDLED_SKLEARN)}. "
            "sklearn's fetch_* data sets (e.g. fetch_openml, fetch_20newsgroups) need a download "
            "and are not available offline"
        )
    X, y = getattr(sklearn.datasets, f"load_{name}")(return_X_y=True)
    return np.asarray(X), np.asarray(y)

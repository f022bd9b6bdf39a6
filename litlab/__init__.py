"""litlab: runnable, tested, comparable experiments for ICML 2026 methods, on PyTorch Lightning."""

# The checkout's `litlab/` folder holds only part of this package: pyproject installs the other top-level folders
# (`kernels/`, `lit_modules/`, ...) into it. Python started in the checkout's root finds that folder first, so
# the installed package (the editable install's tree of links, or a wheel) joins it here.
__path__ = __import__("pkgutil").extend_path(__path__, __name__)

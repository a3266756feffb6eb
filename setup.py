from setuptools import setup

# Everything else is in pyproject.toml; cffi_modules has no pyproject.toml spelling.
setup(cffi_modules=["build.py:ffibuilder"])

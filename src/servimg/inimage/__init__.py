"""Code that runs inside the image: standard library only, Python 3.9-3.13 (tests/test_inimage.py)."""

"""Sphinx configuration of tbq's documentation site: the Markdown pages of docs/
(MyST) and the API reference from the docstrings (autodoc + napoleon).

Build it with warnings as errors, as CI does::

    pip install -e '.[docs]'
    sphinx-build -W --keep-going -b html docs docs/_build/html
"""

from __future__ import annotations

from importlib.metadata import version as _version

project = "tbq"
author = "the tbq maintainers"
copyright = "2026, the tbq maintainers"
release = _version("tbq")
version = ".".join(release.split(".")[:2])

extensions = [
    "sphinx.ext.autodoc",
    "sphinx.ext.napoleon",
    "sphinx.ext.viewcode",
    "myst_parser",
]

source_suffix = {".rst": "restructuredtext", ".md": "markdown"}
root_doc = "index"
exclude_patterns = ["_build", "examples/scale_out/*.md", "Thumbs.db", ".DS_Store"]

# MyST: the pages' own [text](#heading) links resolve through heading anchors.
myst_heading_anchors = 4
myst_enable_extensions = ["dollarmath"]

# autodoc: members in source order, type hints in the description (not the signature,
# where NDArray[np.float32] and friends make signatures unreadable).
autodoc_member_order = "bysource"
autodoc_typehints = "description"
autodoc_default_options = {"members": True, "show-inheritance": True}
napoleon_numpy_docstring = True
napoleon_google_docstring = False


html_theme = "alabaster"
html_title = f"tbq {release}"

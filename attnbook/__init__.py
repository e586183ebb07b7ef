"""The book's code: what the labs run and draw, and the exercises, built on attnlib.

``attnlib`` (its own distribution, ``attnlib/pyproject.toml``) is the library a reader installs to use the
operators and kernels; this package is the book's, and its layers import downwards only
(``tests/test_import_graph.py`` reads every import statement and checks them):

    attnbook.lab           a lab's set-up and checks (seeds, device, quick or full scale, glue), on top
    attnbook.lab_runs      a lab's minutes-long training runs, committed with what made them
    attnbook.exercises     each chapter's exercises and their checker
    attnbook.widgets       the figures: they draw what the experiments return and compute nothing
    attnbook.experiments   what the labs measure: tasks, training, counts, fits, the chapters' arguments
    attnlib                the operators and kernels; never imports this package

``attnbook._provenance`` stamps the committed results (``benchmarks/results/``) with the code they were
made from; it imports nothing of the book.
"""

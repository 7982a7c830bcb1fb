"""Pure tensor helpers for plugin authors: masked reductions, group statistics, response lengths.

Public: the built-in plugins use these, and so may any third-party estimator, loss or reward domain.
"""

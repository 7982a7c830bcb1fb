"""Scoring on the driver: ``manager`` routes rows to reward domains and combines their scores, ``pool`` runs the
checks in worker processes under a hard time limit, ``checks`` holds what a domain's parameters and results must
satisfy.
"""

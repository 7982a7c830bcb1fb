"""The StabilityGuard's machinery, shared by the driver and the actor ranks: ``guard`` runs the configured guard
plugins on a stage's statistics and combines their verdicts (``GuardRunner``); ``faults`` injects faults
(``trainer.faults``) to prove that the guards work.
"""

"""slabtune.calibrate: the seed scenarios reproduced against their published figures, and
fits of cost constants inside their physical ranges (docs/MODEL.md, "Cost constants")."""

"""Layer 4, plans: the ``Plan`` record and what runs it (``plan.py``), its JSON fields
validated (``io.py``), its binding to a traced function (``binding.py``) and the
hand-specified plan of fixed layouts that baselines and the editor make (``fixed.py``)."""

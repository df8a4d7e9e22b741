"""Graph cells: the cell's source analysed, staged as one program, cached, written back."""

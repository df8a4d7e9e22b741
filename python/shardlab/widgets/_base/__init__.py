"""What every view builds on: HTML, live outputs, captured compiler messages, bokeh, progress."""

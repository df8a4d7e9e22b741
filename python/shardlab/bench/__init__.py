"""Benchmarks behind ``make bench``; each module's ``run()`` returns a markdown section."""

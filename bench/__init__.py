"""The benches (run by path: make bench, make bench-load) and bench/report.py, which writes bench/results.md."""

"""Hostile files, drawn at run time and small: images made to cost a decoder as much as possible (`images`),
weights headers, label files and zips that cost a parser that trusts them (`archives`), what a script can send as
the Draw canvas's value (`canvas`), and what students' phones hold (`corpus`, each file with what the app must do).

Here, not under tests/, because the tests and the tools both use them (the unit and app tests, the load test's
attacker, tools/benchmarks/hostile_uploads.py): tools never import tests."""

"""Measurement: throughput (:mod:`.bench`), a whole suite's time to result (:mod:`.suite`), one model under several
configurations against its reference (:mod:`.compare`), and the HTML report of run directories (:mod:`.report`)."""

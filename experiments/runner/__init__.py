"""What a run is made of, for every command that simulates: its configuration (``config``, read from flags and files
by ``config_file``, with the workload's and disaggregation's parts in ``workload_config`` and ``disagg_config``), the
replicas built from it (``replica``), the simulation (``simulation``; disaggregated: ``disagg_run``), its outputs
(``outputs``, written column by column by ``columnar`` and ``csv_text``), the checks against real runs
(``validation``), and the admission of a user's own code (``user_code``)."""

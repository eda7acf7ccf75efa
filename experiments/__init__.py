"""What users run: the ``ferry`` command line (``cli``; one module per subcommand in ``commands/``), what a run is made
of (``runner/``: its configuration, replicas, simulation and outputs), the features with folders of their own
(``plan/``, ``sweep/``, ``explore/``, ``teach/``), real execution (``real/``), the checks against vLLM
(``vllm_check/``) and studies (``studies/``)."""

from costmodel.moved import alias as _alias

# what a run is made of, in experiments.runner since round 4
RUNNER = ("config", "config_file", "workload_config", "disagg_config", "replica", "simulation", "disagg_run",
          "outputs", "validation", "user_code", "columnar", "csv_text")  # fmt: skip

# modules that moved into subpackages: their old import paths keep working (see costmodel.moved)
_alias(
    {
        "experiments.run": "experiments.commands.run",
        "experiments.iteration": "experiments.commands.iteration",
        "experiments.roofline": "experiments.commands.roofline",
        "experiments.validate_kernels": "experiments.commands.validate_kernels",
        "experiments.kv_usage": "experiments.commands.kv_usage",
        "experiments.calibrate": "experiments.commands.calibrate",
        "experiments.validate": "experiments.commands.validate",
        "experiments.llama": "experiments.real.llama",
        "experiments.executor": "experiments.real.executor",
        "experiments.paged_vs_static": "experiments.studies.paged_vs_static",
        "experiments.bench": "experiments.studies.bench",
        "experiments.ratesearch": "experiments.studies.ratesearch",
        **{f"experiments.{m}": f"experiments.runner.{m}" for m in RUNNER},
        "experiments.summary_table": "experiments.commands.summary_table",
        "experiments.sweep_plots": "experiments.sweep.plots",
    }
)

"""What users run: the ``ferry`` command line (``cli``; one module per subcommand in ``commands/``), the run
configuration (``config``) and one simulation from it (``simulation``), real execution (``real/``) and studies
(``studies/``)."""

from costmodel.moved import alias as _alias

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
    }
)

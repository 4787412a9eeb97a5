"""How each built-in benchmark measures, registered against its declaration
(kvbench.benchmarks.specs), which names its module here (`measured_in`): imported when a case of
it first runs."""

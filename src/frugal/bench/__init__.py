"""frugal.bench: every subsystem's benchmark, apart from the library it measures.

One module per area (`store`, `tgraph`, `recsys`, `pipeline`, `pipeline_dp`, `pipeline_llm`,
`planner`, `plan_validation`); each writes `results.json` in the format of ARCHITECTURE.md and
returns a `BenchResult` holding its typed, frozen Summary. What they share (presets, the
child-process cell runner, medians, Summary reading and writing) is `frugal.bench.harness`.
`frugal <area> bench` and `frugal reproduce` call them. A library package never imports
`frugal.bench`.
"""

"""The phase records (dlaunch/analysis/phases.py) are built by field name: each reads the metrics schema's fields of
its own names (STEP_PHASES, OVERHEAD_FIELDS), so a reordered or added schema field cannot shift a figure into
another's place (PhaseTimes was built by position, in STEP_PHASES' order)."""

from dataclasses import fields

from dlaunch.analysis.phases import Overhead, PhaseTimes
from dlaunch.train.metrics_schema import OVERHEAD_FIELDS, STEP_PHASES


def test_the_records_have_the_schemas_fields():
    assert {f.name for f in fields(PhaseTimes)} == set(STEP_PHASES)
    assert {f.name for f in fields(Overhead)} == set(OVERHEAD_FIELDS)


def test_each_figure_is_read_from_the_field_of_its_name_and_averaged_there():
    record = {name: float(i) for i, name in enumerate(reversed(STEP_PHASES))}  # another order than the fields'
    times = PhaseTimes.of(record)
    assert {name: getattr(times, name) for name in STEP_PHASES} == record
    doubled = PhaseTimes.of({name: 2 * value for name, value in record.items()})
    assert PhaseTimes.mean_of([times, doubled]) == PhaseTimes.of({name: 1.5 * v for name, v in record.items()})
    overhead = {name: float(i) for i, name in enumerate(OVERHEAD_FIELDS)}
    assert {name: getattr(Overhead.of(overhead), name) for name in OVERHEAD_FIELDS} == overhead

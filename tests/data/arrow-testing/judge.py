#!/usr/bin/env python3
"""The judge of tests/it/ingest/arrow_testing/: what the gateway must do with each of the
Arrow project's files, by pyarrow's reading of it and the rules of docs/type-mapping.md.

    judge.py plan OUT_DIR FILE...      JSON, one entry per file: its rows, the expected outcome
                                       (load, or refused with a code: at the schema naming a
                                       column, or at a batch naming a column and row), and for
                                       a file refused on values, the same file without the
                                       offending columns and rows, written by pyarrow to OUT_DIR
                                       (its values must load)
    judge.py check-query FILE          stdin: the rows BigQuery returns for the plan's `select`
                                       (REST `v` values); prints the differences from pyarrow's
    judge.py check-staged FILE STAGED  STAGED: the rows the gateway appended (an IPC stream of
                                       the staging schema); prints the differences
    judge.py dump FILE                 the byte order its schema declares and its rows, as
                                       pyarrow reads them (canonical forms)

Written independently of the gateway's code: only pyarrow reads the files, and the rules are
the documentation's. Values are compared as a multiset of rows (a table has no row order).
"""

import base64
import collections
import decimal
import json
import os
import re
import struct
import sys

import pyarrow as pa
import pyarrow.ipc as ipc
import pyarrow.types as t

MICROS_PER_DAY = 86_400_000_000
MIN_MICROS = -62_135_596_800_000_000  # 0001-01-01T00:00:00
MAX_MICROS = 253_402_300_799_999_999  # 9999-12-31T23:59:59.999999
MIN_DAYS, MAX_DAYS = -719_162, 2_932_896  # 0001-01-01, 9999-12-31
MAX_INTERVAL_MONTHS = 10_000 * 12
MAX_INTERVAL_DAYS = 3_660_000
MAX_INTERVAL_MICROS = 87_840_000 * 3_600 * 1_000_000
UNIT_NANOS = {"s": 1_000_000_000, "ms": 1_000_000, "us": 1_000, "ns": 1}
# Flexible column names (BigQuery documentation, Specifying a schema).
NAME = re.compile(r"^[\w\-&%=+:'<>#| \u00c0-\uffff]{1,300}$")
RESERVED_PREFIXES = ("_table_", "_file_", "_partition", "_row_timestamp", "__root__", "_colidentifier",
                     "_change_sequence_number", "_change_type", "_change_timestamp", "_filament_")


def schema_byte_order(path):
    """The byte order the stream's schema message declares ("little" or "big"), read from its
    flatbuffer (Message.header: Schema, whose first field is `endianness`, 0 little, 1 big)."""
    with open(path, "rb") as f:
        data = f.read()
    start = 8 if data[:4] == b"\xff\xff\xff\xff" else 4
    metadata = data[start:]

    def table_field(table, index):
        vtable = table - struct.unpack_from("<i", metadata, table)[0]
        vtable_bytes = struct.unpack_from("<H", metadata, vtable)[0]
        slot = 4 + 2 * index
        return struct.unpack_from("<H", metadata, vtable + slot)[0] if slot < vtable_bytes else 0

    message = struct.unpack_from("<I", metadata, 0)[0]
    header_at = message + table_field(message, 2)
    schema = header_at + struct.unpack_from("<I", metadata, header_at)[0]
    endianness_at = table_field(schema, 0)
    endianness = struct.unpack_from("<h", metadata, schema + endianness_at)[0] if endianness_at else 0
    return "big" if endianness == 1 else "little"


def read(path):
    """The file's table and schema. pyarrow cannot make Python arrays of YearMonth and DayTime
    intervals, so those columns are read as the integers their bytes also are: int32 months,
    and int64 of days then milliseconds."""
    with open(path, "rb") as f:
        data = f.read()
    schema = ipc.open_stream(data).schema
    as_integers = {"month_interval": pa.int32(), "day_time_interval": pa.int64()}
    readable = schema
    for i, field in enumerate(schema):
        if str(field.type) in as_integers:
            readable = readable.set(i, field.with_type(as_integers[str(field.type)]))
    if readable.equals(schema):
        return ipc.open_stream(data).read_all(), schema
    reader = ipc.MessageReader.open_stream(data)
    reader.read_next_message()
    batches = []
    for message in reader:
        batches.append(ipc.read_record_batch(message, readable))
    return pa.Table.from_batches(batches, readable), schema


def storage(typ):
    return typ.storage_type if isinstance(typ, pa.BaseExtensionType) else typ


def is_interval(typ):
    """Intervals of every unit and durations (BigQuery INTERVAL)."""
    return t.is_interval(typ) or t.is_duration(typ) or str(typ) in ("month_interval", "day_time_interval")


def is_list(typ):
    return t.is_list(typ) or t.is_large_list(typ) or t.is_fixed_size_list(typ)


# ---- the schema: which BigQuery type a column gets, or why it has none -------------------

def bigquery_type(typ):
    """The BigQuery type of an Arrow type (docs/type-mapping.md), or raises Unloadable."""
    typ = storage(typ)
    if t.is_dictionary(typ):
        return bigquery_type(typ.value_type)
    if is_list(typ):
        element = bigquery_type(typ.value_type)
        if element.startswith("ARRAY"):
            raise Unloadable("list of list")
        return f"ARRAY<{element}>"
    if t.is_map(typ):
        return f"ARRAY<STRUCT<{bigquery_type(typ.key_type)}, {bigquery_type(typ.item_type)}>>"
    if t.is_struct(typ):
        if typ.num_fields == 0:
            raise Unloadable("empty struct")
        for i in range(typ.num_fields):
            check_name(typ.field(i).name)
        return "STRUCT<" + ", ".join(bigquery_type(typ.field(i).type) for i in range(typ.num_fields)) + ">"
    if t.is_boolean(typ):
        return "BOOL"
    if t.is_uint64(typ):
        return "NUMERIC"
    if t.is_integer(typ):
        return "INT64"
    if t.is_floating(typ):
        return "FLOAT64"
    if t.is_string(typ) or t.is_large_string(typ) or t.is_string_view(typ):
        return "STRING"
    if t.is_binary(typ) or t.is_large_binary(typ) or t.is_binary_view(typ) or t.is_fixed_size_binary(typ):
        return "BYTES"
    if t.is_date(typ):
        return "DATE"
    if t.is_time(typ):
        return "TIME"
    if t.is_timestamp(typ):
        return "TIMESTAMP" if typ.tz is not None else "DATETIME"
    if t.is_decimal(typ):
        integer_digits = typ.precision - typ.scale
        if typ.scale < 0:
            raise Unloadable("negative scale")
        if typ.scale <= 9 and integer_digits <= 29:
            return "NUMERIC"
        if typ.scale <= 38 and integer_digits <= 38:
            return "BIGNUMERIC"
        raise Unloadable("beyond BIGNUMERIC")
    if is_interval(typ):
        return "INTERVAL"
    raise Unloadable(str(typ))


class Unloadable(Exception):
    pass


class BadName(Exception):
    pass


def check_name(name):
    if not NAME.match(name) or name.lower().startswith(RESERVED_PREFIXES):
        raise BadName(name)


def schema_refusals(schema):
    """Every (code, column) the gateway may answer for the schema: a column it cannot load
    (`unsupported_type`) or a name BigQuery refuses (`invalid_identifier`)."""
    refusals, seen = set(), set()
    for field in schema:
        try:
            check_name(field.name)
            if field.name.lower() in seen:
                raise BadName(field.name)
            seen.add(field.name.lower())
        except BadName:
            refusals.add(("invalid_identifier", field.name))
        try:
            bigquery_type(field.type)
        except Unloadable:
            refusals.add(("unsupported_type", field.name))
        except BadName as nested:
            # The gateway names the field itself (`column ""` for a struct field without a name).
            refusals.add(("invalid_identifier", nested.args[0]))
    return refusals


# ---- the values: which cells BigQuery cannot hold exactly --------------------------------

def raw_integers(array):
    """The physical integers of a temporal array (pyarrow converts some units lossily)."""
    width = array.type.bit_width
    return array.view(pa.int32() if width == 32 else pa.int64()).to_pylist()


def micros(value, unit):
    """(whole microseconds, exact) of `value` in `unit`."""
    nanos = value * UNIT_NANOS[unit]
    return nanos // 1000, nanos % 1000 == 0


def interval_parts(value, typ):
    """(months, days, nanoseconds) of one interval or duration value."""
    if t.is_duration(typ):
        return 0, 0, value * UNIT_NANOS[typ.unit]
    if str(typ) == "month_interval":
        return value, 0, 0
    if str(typ) == "day_time_interval":
        return 0, value.days, value.milliseconds * 1_000_000
    return value.months, value.days, value.nanoseconds


def interval_problem(months, days, nanos):
    if nanos % 1000:
        return "precision_loss"
    if abs(months) > MAX_INTERVAL_MONTHS or abs(days) > MAX_INTERVAL_DAYS or abs(nanos // 1000) > MAX_INTERVAL_MICROS:
        return "invalid_value"
    return None


def scalar_problem(value, typ):
    """The code BigQuery's rules give one non-null value of a scalar column, or None."""
    if t.is_date32(typ):
        return None if MIN_DAYS <= value <= MAX_DAYS else "invalid_value"
    if t.is_date64(typ):
        if value % 86_400_000:
            return "precision_loss"
        return None if MIN_DAYS <= value // 86_400_000 <= MAX_DAYS else "invalid_value"
    if t.is_time(typ):
        us, exact = micros(value, typ.unit)
        if not exact:
            return "precision_loss"
        return None if 0 <= us < MICROS_PER_DAY else "invalid_value"
    if t.is_timestamp(typ):
        us, exact = micros(value, typ.unit)
        if not exact:
            return "precision_loss"
        return None if MIN_MICROS <= us <= MAX_MICROS else "invalid_value"
    if is_interval(typ):
        return interval_problem(*interval_parts(value, typ))
    return None


def physical_values(array):
    """Python values of an array, temporal ones as their physical integers, extension types'
    as their storage's."""
    if isinstance(array.type, pa.BaseExtensionType):
        array = array.storage
    typ = array.type
    if t.is_dictionary(typ):
        return physical_values(array.dictionary_decode())
    if t.is_date(typ) or t.is_time(typ) or t.is_timestamp(typ) or t.is_duration(typ):
        valid = array.is_valid().to_pylist()
        return [v if ok else None for v, ok in zip(raw_integers(array.cast(typ)), valid)]
    return array.to_pylist()


def day_times(array):
    """DayTime intervals read as int64: days in the low 32 bits, milliseconds in the high."""
    signed = lambda bits: bits - (1 << 32) if bits >= 1 << 31 else bits
    return [None if v is None else DayTime(signed(v & 0xFFFFFFFF), signed((v >> 32) & 0xFFFFFFFF))
            for v in array.to_pylist()]


class DayTime:
    def __init__(self, days, milliseconds):
        self.days, self.milliseconds = days, milliseconds

    def __repr__(self):
        return f"DayTime({self.days}, {self.milliseconds})"


def value_problems(array, typ, path, rows):
    """Every (code, path, row) of a column (`rows`: the top-level row of each index)."""
    typ = storage(typ)
    if t.is_dictionary(typ):
        return value_problems(array.dictionary_decode(), typ.value_type, path, rows)
    if is_list(typ) or t.is_map(typ):
        problems = set()
        offsets = list(range(0, (len(array) + 1) * typ.list_size, typ.list_size)) if t.is_fixed_size_list(typ) \
            else array.offsets.to_pylist()
        values = array.values if not t.is_map(typ) else None
        element_rows = []
        for i in range(len(array)):
            start, end = offsets[i], offsets[i + 1]
            if array[i].is_valid:
                if values is not None and any(not values[j].is_valid for j in range(start, end)):
                    problems.add(("invalid_value", path, rows[i]))
            element_rows.extend([rows[i]] * (end - start))
        if t.is_map(typ):
            return problems | value_problems(array.keys, typ.key_type, f"{path}.key", element_rows[:len(array.keys)]) \
                | value_problems(array.items, typ.item_type, f"{path}.value", element_rows[:len(array.items)])
        flat = values.slice(offsets[0], offsets[-1] - offsets[0]) if len(array) else values.slice(0, 0)
        element_rows = element_rows[:len(flat)]
        return problems | value_problems(flat, typ.value_type, path, element_rows)
    if t.is_struct(typ):
        problems = set()
        for i in range(typ.num_fields):
            child = array.field(i)
            problems |= value_problems(child, typ.field(i).type, f"{path}.{typ.field(i).name}", rows)
        return problems
    problems = set()
    values = day_times(array) if str(typ) == "day_time_interval" else physical_values(array)
    for i, value in enumerate(values):
        if value is not None:
            code = scalar_problem(value, typ)
            if code:
                problems.add((code, path, rows[i]))
    return problems


def arrays(table, schema):
    """(name, array, Arrow type as the file declares it) of each column."""
    for field, column in zip(schema, table.columns):
        array = column.combine_chunks() if column.num_chunks != 1 else column.chunk(0)
        yield field.name, array, field.type


def table_problems(table, schema):
    problems = set()
    for name, array, typ in arrays(table, schema):
        problems |= value_problems(array, typ, name, list(range(len(array))))
    return problems


# ---- canonical values: what pyarrow holds, what BigQuery returns, what was staged ---------

def canonical(value, typ):
    """A comparable form of one value of an Arrow type, as BigQuery holds it."""
    typ = storage(typ)
    if t.is_dictionary(typ):
        return canonical(value, typ.value_type)
    if is_list(typ):
        return [canonical(v, typ.value_type) for v in (value or [])]
    if t.is_map(typ):
        return [[canonical(k, typ.key_type), canonical(v, typ.item_type)] for k, v in (value or [])]
    if value is None:
        return None
    if t.is_struct(typ):
        return [canonical(value[typ.field(i).name], typ.field(i).type) for i in range(typ.num_fields)]
    if t.is_uint64(typ):
        return decimal_text(value)  # NUMERIC
    if t.is_boolean(typ) or t.is_integer(typ):
        return int(value) if not isinstance(value, bool) else value
    if t.is_floating(typ):
        return repr(float(value))
    if t.is_decimal(typ):
        return decimal_text(value)
    if isinstance(value, bytes):
        return value.hex()
    if t.is_date32(typ):
        return value
    if t.is_date64(typ):
        return value // 86_400_000
    if t.is_time(typ) or t.is_timestamp(typ):
        return micros(value, typ.unit)[0]
    if is_interval(typ):
        months, days, nanos = interval_parts(value, typ)
        return [months, days, nanos // 1000]
    return value


def decimal_text(value):
    number = decimal.Decimal(value)
    text = format(number, "f")
    if "." in text:
        text = text.rstrip("0").rstrip(".")
    return "0" if text in ("-0", "") else text


def expected_rows(table, schema):
    columns = []
    for _, array, typ in arrays(table, schema):
        values = day_times(array) if str(typ) == "day_time_interval" else nested_physical(array)
        columns.append([canonical(v, typ) for v in values])
    return [list(row) for row in zip(*columns)] if columns else []


def nested_physical(array):
    """Python values with temporal scalars (top level or in structs) as physical integers."""
    if isinstance(array.type, pa.BaseExtensionType):
        array = array.storage
    typ = array.type
    if t.is_dictionary(typ):
        return nested_physical(array.dictionary_decode())
    if t.is_struct(typ):
        valid = array.is_valid().to_pylist()
        fields = {typ.field(i).name: nested_physical(array.field(i)) for i in range(typ.num_fields)}
        return [{k: v[i] for k, v in fields.items()} if valid[i] else None for i in range(len(array))]
    return physical_values(array)


# The SQL that reads a column back, and how its REST value becomes the canonical form.
def select_expression(name, typ):
    """(SQL expression, kind) reading one column of BigQuery type `typ` canonically."""
    column = f"`{name}`"
    if typ.startswith("ARRAY<"):
        inner, kind = select_expression("x", typ[len("ARRAY<"):-1])
        inner = inner.replace("`x`", "x")
        return f"ARRAY(SELECT {inner} FROM UNNEST({column}) AS x WITH OFFSET AS o ORDER BY o)", ["array", kind]
    return {
        "BOOL": (f"CAST({column} AS STRING)", "bool"),
        "INT64": (f"CAST({column} AS STRING)", "int"),
        "FLOAT64": (column, "float"),
        "NUMERIC": (f"CAST({column} AS STRING)", "decimal"),
        "BIGNUMERIC": (f"CAST({column} AS STRING)", "decimal"),
        "STRING": (column, "string"),
        "BYTES": (f"TO_BASE64({column})", "base64"),
        "DATE": (f"UNIX_DATE({column})", "int"),
        "TIME": (f"TIME_DIFF({column}, TIME '00:00:00', MICROSECOND)", "int"),
        "DATETIME": (f"UNIX_MICROS(TIMESTAMP({column}))", "int"),
        "TIMESTAMP": (f"UNIX_MICROS({column})", "int"),
    }[typ]


def from_rest(value, kind):
    if isinstance(kind, list):
        return [from_rest(v["v"], kind[1]) for v in (value or [])]
    if value is None:
        return None
    if kind == "bool":
        return value.lower() == "true"
    if kind == "int":
        return int(value)
    if kind == "float":
        return repr(float(value))
    if kind == "decimal":
        return decimal_text(value)
    if kind == "base64":
        return base64.b64decode(value).hex()
    return value


# The emulator cannot store these (../shared/docs/bqemulator.md): their rows are judged as the
# gateway staged them, from the Storage Write fake.
def emulator_holds(typ):
    return not any(kind in typ for kind in ("STRUCT", "BIGNUMERIC", "INTERVAL"))


def from_staged(value, typ):
    """The canonical form of one staged value of a column of BigQuery type `typ`."""
    if typ.startswith("ARRAY<"):
        return [from_staged(v, typ[len("ARRAY<"):-1]) for v in (value or [])]
    if value is None:
        return None
    if typ.startswith("STRUCT<"):
        inner = split_struct(typ[len("STRUCT<"):-1])
        return [from_staged(v, inner[i]) for i, v in enumerate(value.values())]
    if typ == "INT64":
        return int(value)
    if typ == "BOOL":
        return value
    if typ == "FLOAT64":
        return repr(float(value))
    if typ in ("NUMERIC", "BIGNUMERIC"):
        return decimal_text(value)
    if typ == "BYTES":
        return value.hex()
    if typ == "TIME":
        hours, minutes, seconds = value.split(":")
        whole, _, fraction = seconds.partition(".")
        return ((int(hours) * 60 + int(minutes)) * 60 + int(whole)) * 1_000_000 + int((fraction or "0").ljust(6, "0"))
    if typ == "INTERVAL":
        return [int(part) for part in value.split()]
    return value


def split_struct(inner):
    parts, depth, current = [], 0, ""
    for char in inner:
        if char == "<":
            depth += 1
        elif char == ">":
            depth -= 1
        if char == "," and depth == 0:
            parts.append(current.strip())
            current = ""
        else:
            current += char
    return parts + [current.strip()] if current.strip() else parts


def staged_physical(array):
    """Staged values with dates, times and timestamps as physical integers."""
    typ = array.type
    if t.is_date(typ) or t.is_timestamp(typ):
        return physical_values(array)
    if t.is_struct(typ):
        valid = array.is_valid().to_pylist()
        fields = {typ.field(i).name: staged_physical(array.field(i)) for i in range(typ.num_fields)}
        return [{k: v[i] for k, v in fields.items()} if valid[i] else None for i in range(len(array))]
    return array.to_pylist()


# ---- the commands -------------------------------------------------------------------------

def plan_file(path, out_dir, name):
    table, schema = read(path)
    entry = {"name": name, "file": path, "rows": table.num_rows}
    if schema_byte_order(path) == "big":
        entry["expect"] = {"refused_at": "schema", "answers": [["unsupported_byte_order", None]]}
        return entry
    refusals = schema_refusals(schema)
    if refusals:
        entry["expect"] = {"refused_at": "schema", "answers": sorted([code, column] for code, column in refusals)}
        return entry
    problems = table_problems(table, schema)
    if problems:
        entry["expect"] = {"refused_at": "batch", "answers": sorted([c, p, r] for c, p, r in problems)}
        clean = without_problems(table, schema, problems)
        if clean is not None:
            clean_path = os.path.join(out_dir, os.path.basename(os.path.dirname(path)) + "_" + os.path.basename(path))
            with ipc.new_stream(clean_path, clean.schema) as writer:
                writer.write_table(clean)
            entry["clean"] = plan_file(clean_path, out_dir, f"{name} without the refused columns and rows")
        return entry
    types = [bigquery_type(field.type) for field in schema]
    entry["expect"] = {"load": True}
    entry["judge"] = "emulator" if all(emulator_holds(typ) for typ in types) else "staged"
    if entry["judge"] == "emulator":
        entry["select"] = ", ".join(select_expression(f.name, typ)[0] for f, typ in zip(schema, types))
    return entry


def without_problems(table, schema, problems):
    """The table without the columns where most rows are refused, then without the rows
    refused in the others; None when nothing is left."""
    by_column = collections.defaultdict(set)
    for _, path, row in problems:
        by_column[path.split(".")[0]].add(row)
    dropped = [name for name, rows in by_column.items() if len(rows) * 2 > table.num_rows]
    if any(str(field.type) in ("month_interval", "day_time_interval") for field in schema if field.name not in dropped):
        return None  # pyarrow cannot write what it cannot read
    kept = table.drop_columns(dropped)
    bad_rows = set().union(*[rows for name, rows in by_column.items() if name not in dropped])
    kept = kept.filter(pa.array([i not in bad_rows for i in range(table.num_rows)]))
    if kept.num_columns == 0 or kept.num_rows == 0:
        return None
    assert not table_problems(kept, kept.schema)
    return kept


def differences(expected, actual):
    key = lambda row: json.dumps(row, sort_keys=True)
    missing = collections.Counter(map(key, expected)) - collections.Counter(map(key, actual))
    extra = collections.Counter(map(key, actual)) - collections.Counter(map(key, expected))
    return {"missing": sorted(missing.elements())[:5], "unexpected": sorted(extra.elements())[:5],
            "missing_count": sum(missing.values()), "unexpected_count": sum(extra.values())} \
        if missing or extra else None


def check_query(path):
    table, schema = read(path)
    types = [bigquery_type(field.type) for field in schema]
    kinds = [select_expression(f.name, typ)[1] for f, typ in zip(schema, types)]
    rows = json.load(sys.stdin)
    actual = [[from_rest(value, kind) for value, kind in zip(row, kinds)] for row in rows]
    return differences(expected_rows(table, schema), actual)


def check_staged(path, staged_path):
    table, schema = read(path)
    staged, _ = read(staged_path)
    types = [bigquery_type(field.type) for field in schema]
    columns = []
    for column, typ in zip(staged.columns[:len(types)], types):
        array = column.combine_chunks() if column.num_chunks != 1 else column.chunk(0)
        columns.append([from_staged(v, typ) for v in staged_physical(array)])
    actual = [list(row) for row in zip(*columns)] if columns else []
    return differences(expected_rows(table, schema), actual)


def main():
    command, args = sys.argv[1], sys.argv[2:]
    if command == "plan":
        names = [os.path.join(os.path.basename(os.path.dirname(p)), os.path.basename(p)) for p in args[1:]]
        print(json.dumps([plan_file(path, args[0], name) for path, name in zip(args[1:], names)]))
    elif command == "check-query":
        print(json.dumps(check_query(args[0])))
    elif command == "check-staged":
        print(json.dumps(check_staged(args[0], args[1])))
    elif command == "dump":
        table, schema = read(args[0])
        print(json.dumps({"byte_order": schema_byte_order(args[0]), "rows": expected_rows(table, schema)}))
    else:
        sys.exit(f"unknown command {command}")


if __name__ == "__main__":
    main()

from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class BinlogType(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    BINLOG_TYPE_UNSPECIFIED: _ClassVar[BinlogType]
    PREWRITE: _ClassVar[BinlogType]
    COMMIT: _ClassVar[BinlogType]
    ROLLBACK: _ClassVar[BinlogType]
    FAKE: _ClassVar[BinlogType]

class MutationType(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    MUTATION_TYPE_UNSPECIFIED: _ClassVar[MutationType]
    INSERT: _ClassVar[MutationType]
    UPDATE: _ClassVar[MutationType]
    DELETE: _ClassVar[MutationType]
    READ: _ClassVar[MutationType]

class DDLType(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    DDL_TYPE_UNSPECIFIED: _ClassVar[DDLType]
    CREATE_TABLE: _ClassVar[DDLType]
    ALTER_TABLE: _ClassVar[DDLType]
    DROP_TABLE: _ClassVar[DDLType]
    RENAME_TABLE: _ClassVar[DDLType]
    TRUNCATE_TABLE: _ClassVar[DDLType]
    CREATE_DATABASE: _ClassVar[DDLType]
    DROP_DATABASE: _ClassVar[DDLType]
    OTHER: _ClassVar[DDLType]

class TxnState(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    TXN_STATE_UNSPECIFIED: _ClassVar[TxnState]
    TXN_UNKNOWN: _ClassVar[TxnState]
    TXN_COMMITTED: _ClassVar[TxnState]
    TXN_ROLLED_BACK: _ClassVar[TxnState]
    TXN_NOT_FOUND: _ClassVar[TxnState]
BINLOG_TYPE_UNSPECIFIED: BinlogType
PREWRITE: BinlogType
COMMIT: BinlogType
ROLLBACK: BinlogType
FAKE: BinlogType
MUTATION_TYPE_UNSPECIFIED: MutationType
INSERT: MutationType
UPDATE: MutationType
DELETE: MutationType
READ: MutationType
DDL_TYPE_UNSPECIFIED: DDLType
CREATE_TABLE: DDLType
ALTER_TABLE: DDLType
DROP_TABLE: DDLType
RENAME_TABLE: DDLType
TRUNCATE_TABLE: DDLType
CREATE_DATABASE: DDLType
DROP_DATABASE: DDLType
OTHER: DDLType
TXN_STATE_UNSPECIFIED: TxnState
TXN_UNKNOWN: TxnState
TXN_COMMITTED: TxnState
TXN_ROLLED_BACK: TxnState
TXN_NOT_FOUND: TxnState

class Position(_message.Message):
    __slots__ = ("file_seq", "offset", "sub_seq", "file_name", "gtids", "mysql_gtid_set", "ts_ms", "server_id", "generation")
    FILE_SEQ_FIELD_NUMBER: _ClassVar[int]
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    SUB_SEQ_FIELD_NUMBER: _ClassVar[int]
    FILE_NAME_FIELD_NUMBER: _ClassVar[int]
    GTIDS_FIELD_NUMBER: _ClassVar[int]
    MYSQL_GTID_SET_FIELD_NUMBER: _ClassVar[int]
    TS_MS_FIELD_NUMBER: _ClassVar[int]
    SERVER_ID_FIELD_NUMBER: _ClassVar[int]
    GENERATION_FIELD_NUMBER: _ClassVar[int]
    file_seq: int
    offset: int
    sub_seq: int
    file_name: str
    gtids: _containers.RepeatedCompositeFieldContainer[GtidPos]
    mysql_gtid_set: str
    ts_ms: int
    server_id: int
    generation: int
    def __init__(self, file_seq: _Optional[int] = ..., offset: _Optional[int] = ..., sub_seq: _Optional[int] = ..., file_name: _Optional[str] = ..., gtids: _Optional[_Iterable[_Union[GtidPos, _Mapping]]] = ..., mysql_gtid_set: _Optional[str] = ..., ts_ms: _Optional[int] = ..., server_id: _Optional[int] = ..., generation: _Optional[int] = ...) -> None: ...

class GtidPos(_message.Message):
    __slots__ = ("domain_id", "server_id", "seq_no")
    DOMAIN_ID_FIELD_NUMBER: _ClassVar[int]
    SERVER_ID_FIELD_NUMBER: _ClassVar[int]
    SEQ_NO_FIELD_NUMBER: _ClassVar[int]
    domain_id: int
    server_id: int
    seq_no: int
    def __init__(self, domain_id: _Optional[int] = ..., server_id: _Optional[int] = ..., seq_no: _Optional[int] = ...) -> None: ...

class SnapshotProgress(_message.Message):
    __slots__ = ("snapshot_id", "tables", "current_table", "last_chunk_end", "max_key", "chunks_done", "rows_done", "finished", "paused", "mode", "additional_conditions", "recorded_at")
    SNAPSHOT_ID_FIELD_NUMBER: _ClassVar[int]
    TABLES_FIELD_NUMBER: _ClassVar[int]
    CURRENT_TABLE_FIELD_NUMBER: _ClassVar[int]
    LAST_CHUNK_END_FIELD_NUMBER: _ClassVar[int]
    MAX_KEY_FIELD_NUMBER: _ClassVar[int]
    CHUNKS_DONE_FIELD_NUMBER: _ClassVar[int]
    ROWS_DONE_FIELD_NUMBER: _ClassVar[int]
    FINISHED_FIELD_NUMBER: _ClassVar[int]
    PAUSED_FIELD_NUMBER: _ClassVar[int]
    MODE_FIELD_NUMBER: _ClassVar[int]
    ADDITIONAL_CONDITIONS_FIELD_NUMBER: _ClassVar[int]
    RECORDED_AT_FIELD_NUMBER: _ClassVar[int]
    snapshot_id: str
    tables: _containers.RepeatedScalarFieldContainer[str]
    current_table: str
    last_chunk_end: Row
    max_key: Row
    chunks_done: int
    rows_done: int
    finished: bool
    paused: bool
    mode: str
    additional_conditions: _containers.RepeatedScalarFieldContainer[str]
    recorded_at: Position
    def __init__(self, snapshot_id: _Optional[str] = ..., tables: _Optional[_Iterable[str]] = ..., current_table: _Optional[str] = ..., last_chunk_end: _Optional[_Union[Row, _Mapping]] = ..., max_key: _Optional[_Union[Row, _Mapping]] = ..., chunks_done: _Optional[int] = ..., rows_done: _Optional[int] = ..., finished: _Optional[bool] = ..., paused: _Optional[bool] = ..., mode: _Optional[str] = ..., additional_conditions: _Optional[_Iterable[str]] = ..., recorded_at: _Optional[_Union[Position, _Mapping]] = ...) -> None: ...

class Binlog(_message.Message):
    __slots__ = ("tp", "start_ts", "commit_ts", "prewrite_value", "part_no", "part_count", "producer_id", "producer_epoch", "position", "snapshot", "ts_ms")
    TP_FIELD_NUMBER: _ClassVar[int]
    START_TS_FIELD_NUMBER: _ClassVar[int]
    COMMIT_TS_FIELD_NUMBER: _ClassVar[int]
    PREWRITE_VALUE_FIELD_NUMBER: _ClassVar[int]
    PART_NO_FIELD_NUMBER: _ClassVar[int]
    PART_COUNT_FIELD_NUMBER: _ClassVar[int]
    PRODUCER_ID_FIELD_NUMBER: _ClassVar[int]
    PRODUCER_EPOCH_FIELD_NUMBER: _ClassVar[int]
    POSITION_FIELD_NUMBER: _ClassVar[int]
    SNAPSHOT_FIELD_NUMBER: _ClassVar[int]
    TS_MS_FIELD_NUMBER: _ClassVar[int]
    tp: BinlogType
    start_ts: int
    commit_ts: int
    prewrite_value: bytes
    part_no: int
    part_count: int
    producer_id: str
    producer_epoch: int
    position: Position
    snapshot: SnapshotProgress
    ts_ms: int
    def __init__(self, tp: _Optional[_Union[BinlogType, str]] = ..., start_ts: _Optional[int] = ..., commit_ts: _Optional[int] = ..., prewrite_value: _Optional[bytes] = ..., part_no: _Optional[int] = ..., part_count: _Optional[int] = ..., producer_id: _Optional[str] = ..., producer_epoch: _Optional[int] = ..., position: _Optional[_Union[Position, _Mapping]] = ..., snapshot: _Optional[_Union[SnapshotProgress, _Mapping]] = ..., ts_ms: _Optional[int] = ...) -> None: ...

class PrewriteValue(_message.Message):
    __slots__ = ("schema_version", "mutations", "ddl", "schema_snapshots", "source", "snapshot_chunk")
    SCHEMA_VERSION_FIELD_NUMBER: _ClassVar[int]
    MUTATIONS_FIELD_NUMBER: _ClassVar[int]
    DDL_FIELD_NUMBER: _ClassVar[int]
    SCHEMA_SNAPSHOTS_FIELD_NUMBER: _ClassVar[int]
    SOURCE_FIELD_NUMBER: _ClassVar[int]
    SNAPSHOT_CHUNK_FIELD_NUMBER: _ClassVar[int]
    schema_version: int
    mutations: _containers.RepeatedCompositeFieldContainer[TableMutation]
    ddl: DDL
    schema_snapshots: _containers.RepeatedCompositeFieldContainer[TableInfo]
    source: SourceInfo
    snapshot_chunk: bool
    def __init__(self, schema_version: _Optional[int] = ..., mutations: _Optional[_Iterable[_Union[TableMutation, _Mapping]]] = ..., ddl: _Optional[_Union[DDL, _Mapping]] = ..., schema_snapshots: _Optional[_Iterable[_Union[TableInfo, _Mapping]]] = ..., source: _Optional[_Union[SourceInfo, _Mapping]] = ..., snapshot_chunk: _Optional[bool] = ...) -> None: ...

class SourceInfo(_message.Message):
    __slots__ = ("name", "server_id", "gtid", "file", "pos", "ts_ms")
    NAME_FIELD_NUMBER: _ClassVar[int]
    SERVER_ID_FIELD_NUMBER: _ClassVar[int]
    GTID_FIELD_NUMBER: _ClassVar[int]
    FILE_FIELD_NUMBER: _ClassVar[int]
    POS_FIELD_NUMBER: _ClassVar[int]
    TS_MS_FIELD_NUMBER: _ClassVar[int]
    name: str
    server_id: int
    gtid: str
    file: str
    pos: int
    ts_ms: int
    def __init__(self, name: _Optional[str] = ..., server_id: _Optional[int] = ..., gtid: _Optional[str] = ..., file: _Optional[str] = ..., pos: _Optional[int] = ..., ts_ms: _Optional[int] = ...) -> None: ...

class RowChange(_message.Message):
    __slots__ = ("tp", "before", "after")
    TP_FIELD_NUMBER: _ClassVar[int]
    BEFORE_FIELD_NUMBER: _ClassVar[int]
    AFTER_FIELD_NUMBER: _ClassVar[int]
    tp: MutationType
    before: Row
    after: Row
    def __init__(self, tp: _Optional[_Union[MutationType, str]] = ..., before: _Optional[_Union[Row, _Mapping]] = ..., after: _Optional[_Union[Row, _Mapping]] = ...) -> None: ...

class TableMutation(_message.Message):
    __slots__ = ("table_id", "schema_name", "table_name", "table_version", "changes")
    TABLE_ID_FIELD_NUMBER: _ClassVar[int]
    SCHEMA_NAME_FIELD_NUMBER: _ClassVar[int]
    TABLE_NAME_FIELD_NUMBER: _ClassVar[int]
    TABLE_VERSION_FIELD_NUMBER: _ClassVar[int]
    CHANGES_FIELD_NUMBER: _ClassVar[int]
    table_id: int
    schema_name: str
    table_name: str
    table_version: int
    changes: _containers.RepeatedCompositeFieldContainer[RowChange]
    def __init__(self, table_id: _Optional[int] = ..., schema_name: _Optional[str] = ..., table_name: _Optional[str] = ..., table_version: _Optional[int] = ..., changes: _Optional[_Iterable[_Union[RowChange, _Mapping]]] = ...) -> None: ...

class Row(_message.Message):
    __slots__ = ("columns",)
    COLUMNS_FIELD_NUMBER: _ClassVar[int]
    columns: _containers.RepeatedCompositeFieldContainer[Datum]
    def __init__(self, columns: _Optional[_Iterable[_Union[Datum, _Mapping]]] = ...) -> None: ...

class DateTimeValue(_message.Message):
    __slots__ = ("year", "month", "day", "hour", "minute", "second", "microsecond")
    YEAR_FIELD_NUMBER: _ClassVar[int]
    MONTH_FIELD_NUMBER: _ClassVar[int]
    DAY_FIELD_NUMBER: _ClassVar[int]
    HOUR_FIELD_NUMBER: _ClassVar[int]
    MINUTE_FIELD_NUMBER: _ClassVar[int]
    SECOND_FIELD_NUMBER: _ClassVar[int]
    MICROSECOND_FIELD_NUMBER: _ClassVar[int]
    year: int
    month: int
    day: int
    hour: int
    minute: int
    second: int
    microsecond: int
    def __init__(self, year: _Optional[int] = ..., month: _Optional[int] = ..., day: _Optional[int] = ..., hour: _Optional[int] = ..., minute: _Optional[int] = ..., second: _Optional[int] = ..., microsecond: _Optional[int] = ...) -> None: ...

class TimeValue(_message.Message):
    __slots__ = ("negative", "hours", "minutes", "seconds", "microseconds")
    NEGATIVE_FIELD_NUMBER: _ClassVar[int]
    HOURS_FIELD_NUMBER: _ClassVar[int]
    MINUTES_FIELD_NUMBER: _ClassVar[int]
    SECONDS_FIELD_NUMBER: _ClassVar[int]
    MICROSECONDS_FIELD_NUMBER: _ClassVar[int]
    negative: bool
    hours: int
    minutes: int
    seconds: int
    microseconds: int
    def __init__(self, negative: _Optional[bool] = ..., hours: _Optional[int] = ..., minutes: _Optional[int] = ..., seconds: _Optional[int] = ..., microseconds: _Optional[int] = ...) -> None: ...

class Datum(_message.Message):
    __slots__ = ("null", "int", "uint", "double", "decimal", "bytes", "str", "datetime", "time", "json")
    NULL_FIELD_NUMBER: _ClassVar[int]
    INT_FIELD_NUMBER: _ClassVar[int]
    UINT_FIELD_NUMBER: _ClassVar[int]
    DOUBLE_FIELD_NUMBER: _ClassVar[int]
    DECIMAL_FIELD_NUMBER: _ClassVar[int]
    BYTES_FIELD_NUMBER: _ClassVar[int]
    STR_FIELD_NUMBER: _ClassVar[int]
    DATETIME_FIELD_NUMBER: _ClassVar[int]
    TIME_FIELD_NUMBER: _ClassVar[int]
    JSON_FIELD_NUMBER: _ClassVar[int]
    null: bool
    int: int
    uint: int
    double: float
    decimal: str
    bytes: bytes
    str: str
    datetime: DateTimeValue
    time: TimeValue
    json: str
    def __init__(self, null: _Optional[bool] = ..., int: _Optional[int] = ..., uint: _Optional[int] = ..., double: _Optional[float] = ..., decimal: _Optional[str] = ..., bytes: _Optional[bytes] = ..., str: _Optional[str] = ..., datetime: _Optional[_Union[DateTimeValue, _Mapping]] = ..., time: _Optional[_Union[TimeValue, _Mapping]] = ..., json: _Optional[str] = ...) -> None: ...

class ColumnInfo(_message.Message):
    __slots__ = ("name", "data_type", "column_type", "nullable", "unsigned", "length", "precision", "scale", "charset", "elements", "generated", "hidden", "collation", "generation_expression", "generated_stored")
    NAME_FIELD_NUMBER: _ClassVar[int]
    DATA_TYPE_FIELD_NUMBER: _ClassVar[int]
    COLUMN_TYPE_FIELD_NUMBER: _ClassVar[int]
    NULLABLE_FIELD_NUMBER: _ClassVar[int]
    UNSIGNED_FIELD_NUMBER: _ClassVar[int]
    LENGTH_FIELD_NUMBER: _ClassVar[int]
    PRECISION_FIELD_NUMBER: _ClassVar[int]
    SCALE_FIELD_NUMBER: _ClassVar[int]
    CHARSET_FIELD_NUMBER: _ClassVar[int]
    ELEMENTS_FIELD_NUMBER: _ClassVar[int]
    GENERATED_FIELD_NUMBER: _ClassVar[int]
    HIDDEN_FIELD_NUMBER: _ClassVar[int]
    COLLATION_FIELD_NUMBER: _ClassVar[int]
    GENERATION_EXPRESSION_FIELD_NUMBER: _ClassVar[int]
    GENERATED_STORED_FIELD_NUMBER: _ClassVar[int]
    name: str
    data_type: str
    column_type: str
    nullable: bool
    unsigned: bool
    length: int
    precision: int
    scale: int
    charset: str
    elements: _containers.RepeatedScalarFieldContainer[str]
    generated: bool
    hidden: bool
    collation: str
    generation_expression: str
    generated_stored: bool
    def __init__(self, name: _Optional[str] = ..., data_type: _Optional[str] = ..., column_type: _Optional[str] = ..., nullable: _Optional[bool] = ..., unsigned: _Optional[bool] = ..., length: _Optional[int] = ..., precision: _Optional[int] = ..., scale: _Optional[int] = ..., charset: _Optional[str] = ..., elements: _Optional[_Iterable[str]] = ..., generated: _Optional[bool] = ..., hidden: _Optional[bool] = ..., collation: _Optional[str] = ..., generation_expression: _Optional[str] = ..., generated_stored: _Optional[bool] = ...) -> None: ...

class IndexInfo(_message.Message):
    __slots__ = ("name", "columns", "primary", "unique")
    NAME_FIELD_NUMBER: _ClassVar[int]
    COLUMNS_FIELD_NUMBER: _ClassVar[int]
    PRIMARY_FIELD_NUMBER: _ClassVar[int]
    UNIQUE_FIELD_NUMBER: _ClassVar[int]
    name: str
    columns: _containers.RepeatedScalarFieldContainer[str]
    primary: bool
    unique: bool
    def __init__(self, name: _Optional[str] = ..., columns: _Optional[_Iterable[str]] = ..., primary: _Optional[bool] = ..., unique: _Optional[bool] = ...) -> None: ...

class TableInfo(_message.Message):
    __slots__ = ("table_id", "schema_name", "table_name", "version", "columns", "indexes", "charset", "source", "collation")
    TABLE_ID_FIELD_NUMBER: _ClassVar[int]
    SCHEMA_NAME_FIELD_NUMBER: _ClassVar[int]
    TABLE_NAME_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    COLUMNS_FIELD_NUMBER: _ClassVar[int]
    INDEXES_FIELD_NUMBER: _ClassVar[int]
    CHARSET_FIELD_NUMBER: _ClassVar[int]
    SOURCE_FIELD_NUMBER: _ClassVar[int]
    COLLATION_FIELD_NUMBER: _ClassVar[int]
    table_id: int
    schema_name: str
    table_name: str
    version: int
    columns: _containers.RepeatedCompositeFieldContainer[ColumnInfo]
    indexes: _containers.RepeatedCompositeFieldContainer[IndexInfo]
    charset: str
    source: str
    collation: str
    def __init__(self, table_id: _Optional[int] = ..., schema_name: _Optional[str] = ..., table_name: _Optional[str] = ..., version: _Optional[int] = ..., columns: _Optional[_Iterable[_Union[ColumnInfo, _Mapping]]] = ..., indexes: _Optional[_Iterable[_Union[IndexInfo, _Mapping]]] = ..., charset: _Optional[str] = ..., source: _Optional[str] = ..., collation: _Optional[str] = ...) -> None: ...

class DDL(_message.Message):
    __slots__ = ("tp", "schema_name", "table_name", "query", "table_info", "old_schema_name", "old_table_name", "table_id")
    TP_FIELD_NUMBER: _ClassVar[int]
    SCHEMA_NAME_FIELD_NUMBER: _ClassVar[int]
    TABLE_NAME_FIELD_NUMBER: _ClassVar[int]
    QUERY_FIELD_NUMBER: _ClassVar[int]
    TABLE_INFO_FIELD_NUMBER: _ClassVar[int]
    OLD_SCHEMA_NAME_FIELD_NUMBER: _ClassVar[int]
    OLD_TABLE_NAME_FIELD_NUMBER: _ClassVar[int]
    TABLE_ID_FIELD_NUMBER: _ClassVar[int]
    tp: DDLType
    schema_name: str
    table_name: str
    query: str
    table_info: TableInfo
    old_schema_name: str
    old_table_name: str
    table_id: int
    def __init__(self, tp: _Optional[_Union[DDLType, str]] = ..., schema_name: _Optional[str] = ..., table_name: _Optional[str] = ..., query: _Optional[str] = ..., table_info: _Optional[_Union[TableInfo, _Mapping]] = ..., old_schema_name: _Optional[str] = ..., old_table_name: _Optional[str] = ..., table_id: _Optional[int] = ...) -> None: ...

class WriteBinlogReq(_message.Message):
    __slots__ = ("cluster_id", "payload")
    CLUSTER_ID_FIELD_NUMBER: _ClassVar[int]
    PAYLOAD_FIELD_NUMBER: _ClassVar[int]
    cluster_id: int
    payload: bytes
    def __init__(self, cluster_id: _Optional[int] = ..., payload: _Optional[bytes] = ...) -> None: ...

class WriteBinlogResp(_message.Message):
    __slots__ = ("served_watermark",)
    SERVED_WATERMARK_FIELD_NUMBER: _ClassVar[int]
    served_watermark: int
    def __init__(self, served_watermark: _Optional[int] = ...) -> None: ...

class WriteBinlogsReq(_message.Message):
    __slots__ = ("cluster_id", "payloads")
    CLUSTER_ID_FIELD_NUMBER: _ClassVar[int]
    PAYLOADS_FIELD_NUMBER: _ClassVar[int]
    cluster_id: int
    payloads: _containers.RepeatedScalarFieldContainer[bytes]
    def __init__(self, cluster_id: _Optional[int] = ..., payloads: _Optional[_Iterable[bytes]] = ...) -> None: ...

class WriteBinlogsResp(_message.Message):
    __slots__ = ("served_watermark",)
    SERVED_WATERMARK_FIELD_NUMBER: _ClassVar[int]
    served_watermark: int
    def __init__(self, served_watermark: _Optional[int] = ...) -> None: ...

class PullBinlogsReq(_message.Message):
    __slots__ = ("cluster_id", "after_commit_ts", "consumer_id", "with_schema", "packed_meta")
    CLUSTER_ID_FIELD_NUMBER: _ClassVar[int]
    AFTER_COMMIT_TS_FIELD_NUMBER: _ClassVar[int]
    CONSUMER_ID_FIELD_NUMBER: _ClassVar[int]
    WITH_SCHEMA_FIELD_NUMBER: _ClassVar[int]
    PACKED_META_FIELD_NUMBER: _ClassVar[int]
    cluster_id: int
    after_commit_ts: int
    consumer_id: str
    with_schema: bool
    packed_meta: bool
    def __init__(self, cluster_id: _Optional[int] = ..., after_commit_ts: _Optional[int] = ..., consumer_id: _Optional[str] = ..., with_schema: _Optional[bool] = ..., packed_meta: _Optional[bool] = ...) -> None: ...

class PullBinlogsResp(_message.Message):
    __slots__ = ("binlogs", "watermark", "schema_only", "txns", "txn_commit_ts", "txn_start_ts", "txn_end", "fake_index", "positioned_index")
    BINLOGS_FIELD_NUMBER: _ClassVar[int]
    WATERMARK_FIELD_NUMBER: _ClassVar[int]
    SCHEMA_ONLY_FIELD_NUMBER: _ClassVar[int]
    TXNS_FIELD_NUMBER: _ClassVar[int]
    TXN_COMMIT_TS_FIELD_NUMBER: _ClassVar[int]
    TXN_START_TS_FIELD_NUMBER: _ClassVar[int]
    TXN_END_FIELD_NUMBER: _ClassVar[int]
    FAKE_INDEX_FIELD_NUMBER: _ClassVar[int]
    POSITIONED_INDEX_FIELD_NUMBER: _ClassVar[int]
    binlogs: _containers.RepeatedScalarFieldContainer[bytes]
    watermark: int
    schema_only: bool
    txns: _containers.RepeatedCompositeFieldContainer[TxnMeta]
    txn_commit_ts: _containers.RepeatedScalarFieldContainer[int]
    txn_start_ts: _containers.RepeatedScalarFieldContainer[int]
    txn_end: _containers.RepeatedScalarFieldContainer[int]
    fake_index: _containers.RepeatedScalarFieldContainer[int]
    positioned_index: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, binlogs: _Optional[_Iterable[bytes]] = ..., watermark: _Optional[int] = ..., schema_only: _Optional[bool] = ..., txns: _Optional[_Iterable[_Union[TxnMeta, _Mapping]]] = ..., txn_commit_ts: _Optional[_Iterable[int]] = ..., txn_start_ts: _Optional[_Iterable[int]] = ..., txn_end: _Optional[_Iterable[int]] = ..., fake_index: _Optional[_Iterable[int]] = ..., positioned_index: _Optional[_Iterable[int]] = ...) -> None: ...

class TxnMeta(_message.Message):
    __slots__ = ("tp", "start_ts", "commit_ts", "producer_id", "producer_epoch", "position", "snapshot", "ts_ms", "binlog_count")
    TP_FIELD_NUMBER: _ClassVar[int]
    START_TS_FIELD_NUMBER: _ClassVar[int]
    COMMIT_TS_FIELD_NUMBER: _ClassVar[int]
    PRODUCER_ID_FIELD_NUMBER: _ClassVar[int]
    PRODUCER_EPOCH_FIELD_NUMBER: _ClassVar[int]
    POSITION_FIELD_NUMBER: _ClassVar[int]
    SNAPSHOT_FIELD_NUMBER: _ClassVar[int]
    TS_MS_FIELD_NUMBER: _ClassVar[int]
    BINLOG_COUNT_FIELD_NUMBER: _ClassVar[int]
    tp: BinlogType
    start_ts: int
    commit_ts: int
    producer_id: str
    producer_epoch: int
    position: bytes
    snapshot: bytes
    ts_ms: int
    binlog_count: int
    def __init__(self, tp: _Optional[_Union[BinlogType, str]] = ..., start_ts: _Optional[int] = ..., commit_ts: _Optional[int] = ..., producer_id: _Optional[str] = ..., producer_epoch: _Optional[int] = ..., position: _Optional[bytes] = ..., snapshot: _Optional[bytes] = ..., ts_ms: _Optional[int] = ..., binlog_count: _Optional[int] = ...) -> None: ...

class GetProducerPositionReq(_message.Message):
    __slots__ = ("cluster_id", "producer_id", "epoch", "peek")
    CLUSTER_ID_FIELD_NUMBER: _ClassVar[int]
    PRODUCER_ID_FIELD_NUMBER: _ClassVar[int]
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    PEEK_FIELD_NUMBER: _ClassVar[int]
    cluster_id: int
    producer_id: str
    epoch: int
    peek: bool
    def __init__(self, cluster_id: _Optional[int] = ..., producer_id: _Optional[str] = ..., epoch: _Optional[int] = ..., peek: _Optional[bool] = ...) -> None: ...

class GetProducerPositionResp(_message.Message):
    __slots__ = ("position", "snapshot", "epoch", "has_position")
    POSITION_FIELD_NUMBER: _ClassVar[int]
    SNAPSHOT_FIELD_NUMBER: _ClassVar[int]
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    HAS_POSITION_FIELD_NUMBER: _ClassVar[int]
    position: Position
    snapshot: SnapshotProgress
    epoch: int
    has_position: bool
    def __init__(self, position: _Optional[_Union[Position, _Mapping]] = ..., snapshot: _Optional[_Union[SnapshotProgress, _Mapping]] = ..., epoch: _Optional[int] = ..., has_position: _Optional[bool] = ...) -> None: ...

class GetCommitReq(_message.Message):
    __slots__ = ("cluster_id", "start_ts")
    CLUSTER_ID_FIELD_NUMBER: _ClassVar[int]
    START_TS_FIELD_NUMBER: _ClassVar[int]
    cluster_id: int
    start_ts: int
    def __init__(self, cluster_id: _Optional[int] = ..., start_ts: _Optional[int] = ...) -> None: ...

class GetCommitResp(_message.Message):
    __slots__ = ("state", "commit_ts")
    STATE_FIELD_NUMBER: _ClassVar[int]
    COMMIT_TS_FIELD_NUMBER: _ClassVar[int]
    state: TxnState
    commit_ts: int
    def __init__(self, state: _Optional[_Union[TxnState, str]] = ..., commit_ts: _Optional[int] = ...) -> None: ...

class ResolveTxnReq(_message.Message):
    __slots__ = ("cluster_id", "start_ts", "commit_ts", "rollback")
    CLUSTER_ID_FIELD_NUMBER: _ClassVar[int]
    START_TS_FIELD_NUMBER: _ClassVar[int]
    COMMIT_TS_FIELD_NUMBER: _ClassVar[int]
    ROLLBACK_FIELD_NUMBER: _ClassVar[int]
    cluster_id: int
    start_ts: int
    commit_ts: int
    rollback: bool
    def __init__(self, cluster_id: _Optional[int] = ..., start_ts: _Optional[int] = ..., commit_ts: _Optional[int] = ..., rollback: _Optional[bool] = ...) -> None: ...

class ResolveTxnResp(_message.Message):
    __slots__ = ("state",)
    STATE_FIELD_NUMBER: _ClassVar[int]
    state: TxnState
    def __init__(self, state: _Optional[_Union[TxnState, str]] = ...) -> None: ...

class PumpStatusReq(_message.Message):
    __slots__ = ("cluster_id",)
    CLUSTER_ID_FIELD_NUMBER: _ClassVar[int]
    cluster_id: int
    def __init__(self, cluster_id: _Optional[int] = ...) -> None: ...

class PumpStatusResp(_message.Message):
    __slots__ = ("node_id", "state", "served_watermark", "max_commit_ts", "unresolved", "storage_bytes", "gc_ts")
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    SERVED_WATERMARK_FIELD_NUMBER: _ClassVar[int]
    MAX_COMMIT_TS_FIELD_NUMBER: _ClassVar[int]
    UNRESOLVED_FIELD_NUMBER: _ClassVar[int]
    STORAGE_BYTES_FIELD_NUMBER: _ClassVar[int]
    GC_TS_FIELD_NUMBER: _ClassVar[int]
    node_id: str
    state: str
    served_watermark: int
    max_commit_ts: int
    unresolved: int
    storage_bytes: int
    gc_ts: int
    def __init__(self, node_id: _Optional[str] = ..., state: _Optional[str] = ..., served_watermark: _Optional[int] = ..., max_commit_ts: _Optional[int] = ..., unresolved: _Optional[int] = ..., storage_bytes: _Optional[int] = ..., gc_ts: _Optional[int] = ...) -> None: ...

class NotifyReq(_message.Message):
    __slots__ = ("cluster_id", "pump_id", "pump_addr")
    CLUSTER_ID_FIELD_NUMBER: _ClassVar[int]
    PUMP_ID_FIELD_NUMBER: _ClassVar[int]
    PUMP_ADDR_FIELD_NUMBER: _ClassVar[int]
    cluster_id: int
    pump_id: str
    pump_addr: str
    def __init__(self, cluster_id: _Optional[int] = ..., pump_id: _Optional[str] = ..., pump_addr: _Optional[str] = ...) -> None: ...

class NotifyResp(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class TxnStatusReq(_message.Message):
    __slots__ = ("cluster_id", "start_ts")
    CLUSTER_ID_FIELD_NUMBER: _ClassVar[int]
    START_TS_FIELD_NUMBER: _ClassVar[int]
    cluster_id: int
    start_ts: int
    def __init__(self, cluster_id: _Optional[int] = ..., start_ts: _Optional[int] = ...) -> None: ...

class TxnStatusResp(_message.Message):
    __slots__ = ("state", "commit_ts")
    STATE_FIELD_NUMBER: _ClassVar[int]
    COMMIT_TS_FIELD_NUMBER: _ClassVar[int]
    state: TxnState
    commit_ts: int
    def __init__(self, state: _Optional[_Union[TxnState, str]] = ..., commit_ts: _Optional[int] = ...) -> None: ...

class GetTSReq(_message.Message):
    __slots__ = ("cluster_id", "count")
    CLUSTER_ID_FIELD_NUMBER: _ClassVar[int]
    COUNT_FIELD_NUMBER: _ClassVar[int]
    cluster_id: int
    count: int
    def __init__(self, cluster_id: _Optional[int] = ..., count: _Optional[int] = ...) -> None: ...

class GetTSResp(_message.Message):
    __slots__ = ("first_ts", "count")
    FIRST_TS_FIELD_NUMBER: _ClassVar[int]
    COUNT_FIELD_NUMBER: _ClassVar[int]
    first_ts: int
    count: int
    def __init__(self, first_ts: _Optional[int] = ..., count: _Optional[int] = ...) -> None: ...

class DrainerPullReq(_message.Message):
    __slots__ = ("cluster_id", "after_commit_ts", "consumer_id")
    CLUSTER_ID_FIELD_NUMBER: _ClassVar[int]
    AFTER_COMMIT_TS_FIELD_NUMBER: _ClassVar[int]
    CONSUMER_ID_FIELD_NUMBER: _ClassVar[int]
    cluster_id: int
    after_commit_ts: int
    consumer_id: str
    def __init__(self, cluster_id: _Optional[int] = ..., after_commit_ts: _Optional[int] = ..., consumer_id: _Optional[str] = ...) -> None: ...

class DrainerPullResp(_message.Message):
    __slots__ = ("binlogs", "watermark")
    BINLOGS_FIELD_NUMBER: _ClassVar[int]
    WATERMARK_FIELD_NUMBER: _ClassVar[int]
    binlogs: _containers.RepeatedScalarFieldContainer[bytes]
    watermark: int
    def __init__(self, binlogs: _Optional[_Iterable[bytes]] = ..., watermark: _Optional[int] = ...) -> None: ...

class AckReq(_message.Message):
    __slots__ = ("cluster_id", "consumer_id", "commit_ts")
    CLUSTER_ID_FIELD_NUMBER: _ClassVar[int]
    CONSUMER_ID_FIELD_NUMBER: _ClassVar[int]
    COMMIT_TS_FIELD_NUMBER: _ClassVar[int]
    cluster_id: int
    consumer_id: str
    commit_ts: int
    def __init__(self, cluster_id: _Optional[int] = ..., consumer_id: _Optional[str] = ..., commit_ts: _Optional[int] = ...) -> None: ...

class AckResp(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

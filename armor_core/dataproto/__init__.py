"""DataProto, the batch every stage and every worker passes: rows of tensors and numpy columns plus ``meta_info``.

``protocol`` holds the class, ``item`` one row (``data[i]``), ``rules`` the checks and merge rules behind its
operations, ``io`` its bytes on disk and between processes, ``metrics`` the rule that merges metrics from several
workers. Public: plugins may import it.
"""

from armor_core.dataproto.item import DataProtoItem
from armor_core.dataproto.protocol import DataProto

__all__ = ["DataProto", "DataProtoItem"]

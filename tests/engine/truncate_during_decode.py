"""Child script of test_truncation.py: load SRC's copy PATH, decode a token, truncate PATH into
its expert tensors, decode on; prints "COMPLETED n" or "ERROR message" (a SIGBUS kills it).

    python truncate_during_decode.py SRC PATH MEMORY COMPUTE [DEVICE_MEM HOST_MEM]
"""
import os
import shutil
import sys

import strata
from strata.errors import StrataError

src, path, memory, compute = sys.argv[1:5]
shutil.copyfile(src, path)
kw = dict(threads=1, n_ctx=64, memory=memory, compute=compute)
if memory == "tiered":  # budgets so small that experts keep being read from the file
    kw.update(device_mem=int(sys.argv[5]), host_mem=int(sys.argv[6]), prefetch_depth=0)
model = strata.load(path, **kw)
chunks = iter(model.generate("Hello world, this is a test", max_tokens=40, stream=True, stop_token_ids=[]))
next(chunks)
first_expert = min(t.offset for name, t in model.model_file.tensors.items() if "_exps" in name)
os.truncate(path, first_expert + 100)
print("TRUNCATED", os.path.getsize(path), flush=True)
try:
    print("COMPLETED", sum(1 for _ in chunks))
except StrataError as e:
    print("ERROR", e)

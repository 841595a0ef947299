"""A module whose import never ends (ten minutes), after writing the file ``MN_IMPORT_MARK``: a
``--preload`` template stuck in its imports, for the tests of stopping the agent there."""

import os
import pathlib
import time

if os.environ.get("MN_IMPORT_MARK"):
    pathlib.Path(os.environ["MN_IMPORT_MARK"]).write_text("importing")
time.sleep(600)

"""The code that runs inside a trial Job on a GPU node (and the protocol it speaks)."""

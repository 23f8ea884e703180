# CMake generated Testfile for 
# Source directory: /work/wt-transport
# Build directory: /work/wt-transport/build-rel
# 
# This file includes the relevant testing commands required for 
# testing this directory and lists subdirectories to be tested as well.
subdirs("graph")
subdirs("transport")
subdirs("bench")
subdirs("tests")

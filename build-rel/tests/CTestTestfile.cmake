# CMake generated Testfile for 
# Source directory: /work/wt-transport/tests
# Build directory: /work/wt-transport/build-rel/tests
# 
# This file includes the relevant testing commands required for 
# testing this directory and lists subdirectories to be tested as well.
subdirs("transport")

# CMake generated Testfile for 
# Source directory: /work/wt-transport/tests/transport
# Build directory: /work/wt-transport/build-rel/tests/transport
# 
# This file includes the relevant testing commands required for 
# testing this directory and lists subdirectories to be tested as well.
include("/work/wt-transport/build-rel/tests/transport/test_transport_identity_include-b12d07c.cmake")
include("/work/wt-transport/build-rel/tests/transport/test_transport_frame_include-b12d07c.cmake")
include("/work/wt-transport/build-rel/tests/transport/test_transport_admission_include-b12d07c.cmake")
include("/work/wt-transport/build-rel/tests/transport/test_transport_endpoint_include-b12d07c.cmake")

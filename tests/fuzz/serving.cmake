# Fuzzer of mesh_serving_core: the API's request parser, a decoder of outside input (any bytes:
# a 400 with a well-formed error body, or a request within its documented bounds).
if(TARGET mesh_serving_core)
  find_package(nlohmann_json REQUIRED)
  mesh_add_fuzzer(fuzz_serving_request SOURCES ${CMAKE_CURRENT_SOURCE_DIR}/fuzz_serving_request.cpp
    LIBS mesh_serving_core nlohmann_json::nlohmann_json)
endif()

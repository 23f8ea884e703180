# The installed package: `cmake --install <build> [--prefix P]` puts the client API (headers and
# static libraries), meshnode and meshctl under P, with a CMake package config so that another
# project does
#   find_package(meshnode REQUIRED)
#   target_link_libraries(app PRIVATE meshnode::client)
# See docs/node.md ("Using the client API from another project") and examples/.
include(GNUInstallDirs)
include(CMakePackageConfigHelpers)

# Every static library meshnode::client needs at link time: its PUBLIC dependencies and the
# PRIVATE ones too (a static library carries no link information of its own, so CMake exports
# those as link-only dependencies, and they must be installed as well).
set(mesh_client_libraries mesh_client mesh_wire mesh_graph mesh_base mesh_transport mesh_discovery mesh_discovery_core)
set_target_properties(mesh_client PROPERTIES EXPORT_NAME client)
set_target_properties(mesh_wire PROPERTIES EXPORT_NAME wire)
set_target_properties(mesh_graph PROPERTIES EXPORT_NAME graph)
set_target_properties(mesh_base PROPERTIES EXPORT_NAME base)
set_target_properties(mesh_transport PROPERTIES EXPORT_NAME transport)
set_target_properties(mesh_discovery PROPERTIES EXPORT_NAME discovery)
set_target_properties(mesh_discovery_core PROPERTIES EXPORT_NAME discovery_core)
add_library(meshnode::client ALIAS mesh_client)  # the same name inside this build

# Headers go under include/meshnode/ and are included as "graph/graph.hpp", "client/client.hpp",
# as inside this tree. The set is the public API plus everything it includes (checked with
# `g++ -MM`: client.hpp pulls in wire/, graph/ and base/; wire/ includes graph/, graph/ base/; none includes CAF).
set(mesh_include_dir ${CMAKE_INSTALL_INCLUDEDIR}/meshnode)
target_include_directories(mesh_base PUBLIC $<INSTALL_INTERFACE:${mesh_include_dir}>)
file(GLOB mesh_base_headers ${PROJECT_SOURCE_DIR}/base/*.hpp)
file(GLOB mesh_graph_headers ${PROJECT_SOURCE_DIR}/graph/*.hpp)
file(GLOB mesh_client_headers ${PROJECT_SOURCE_DIR}/client/*.hpp)
file(GLOB mesh_wire_headers ${PROJECT_SOURCE_DIR}/wire/*.hpp)
install(FILES ${mesh_base_headers} DESTINATION ${mesh_include_dir}/base COMPONENT dev)
install(FILES ${mesh_graph_headers} DESTINATION ${mesh_include_dir}/graph COMPONENT dev)
install(FILES ${mesh_client_headers} DESTINATION ${mesh_include_dir}/client COMPONENT dev)
install(FILES ${mesh_wire_headers} DESTINATION ${mesh_include_dir}/wire COMPONENT dev)

# Libraries built with sanitizers need their run-time libraries in whatever links them.
if(MESH_SANITIZE)
  target_link_options(mesh_graph INTERFACE $<INSTALL_INTERFACE:-fsanitize=address,undefined>)
endif()

set(mesh_cmake_dir ${CMAKE_INSTALL_LIBDIR}/cmake/meshnode)
install(TARGETS ${mesh_client_libraries} EXPORT meshnode_targets
        ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR} COMPONENT dev)
install(EXPORT meshnode_targets NAMESPACE meshnode:: FILE meshnodeTargets.cmake
        DESTINATION ${mesh_cmake_dir} COMPONENT dev)
configure_package_config_file(${PROJECT_SOURCE_DIR}/cmake/meshnodeConfig.cmake.in
                              ${PROJECT_BINARY_DIR}/meshnodeConfig.cmake INSTALL_DESTINATION ${mesh_cmake_dir})
write_basic_package_version_file(${PROJECT_BINARY_DIR}/meshnodeConfigVersion.cmake
                                 COMPATIBILITY SameMinorVersion)
install(FILES ${PROJECT_BINARY_DIR}/meshnodeConfig.cmake ${PROJECT_BINARY_DIR}/meshnodeConfigVersion.cmake
        DESTINATION ${mesh_cmake_dir} COMPONENT dev)

# The programs, for a prefix that is a complete installation.
install(TARGETS meshnode meshctl RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR} COMPONENT programs)

# install.cmake: `cmake --install BUILD --prefix P` (and `make install PREFIX=P`).
#
# Names. Debian's libflint-dev (FLINT, the number-theory library) already ships
# /usr/include/flint/flint.h, libflint.so and -lflint, so ours are installed as
#   libraries   libflint-dataflow.so.0, libflint-dataflow-ml.so.0, libflint-dataflow-gpu.so.0
#   headers     P/include/flint-dataflow/flint/*.h (programs still write <flint/flint.h>;
#               the -I that pkg-config and the CMake target give is P/include/flint-dataflow)
#   pkg-config  flint-dataflow, flint-dataflow-ml, flint-dataflow-gpu
#   CMake       find_package(FlintDataflow): FlintDataflow::flint, ::ml, ::gpu
# and both can be installed at once (tests/test_install.sh builds a program against ours with
# Debian's present). The commands keep their names: bin/flint and bin/flint-train.
#
# Run paths are relative: the libraries find each other through $ORIGIN, the commands find
# the libraries through $ORIGIN/../lib, and libflint finds the flint command (local-cluster)
# at ../bin from its own folder, so an installed tree can be moved.

set(FLINT_INCLUDEDIR ${CMAKE_INSTALL_INCLUDEDIR}/${FLINT_INSTALL_NAME})
set(FLINT_CMAKEDIR ${CMAKE_INSTALL_LIBDIR}/cmake/FlintDataflow)

set_target_properties(flint flint_ml flint_gpu PROPERTIES INSTALL_RPATH "$ORIGIN")
set_target_properties(flint_cli flint_train_cli PROPERTIES INSTALL_RPATH "$ORIGIN/${FLINT_BIN_TO_LIB}")
set_target_properties(flint PROPERTIES EXPORT_NAME flint)
set_target_properties(flint_ml PROPERTIES EXPORT_NAME ml)
set_target_properties(flint_gpu PROPERTIES EXPORT_NAME gpu)
foreach(lib flint flint_ml flint_gpu)
  target_include_directories(${lib} INTERFACE $<INSTALL_INTERFACE:${FLINT_INCLUDEDIR}>)
endforeach()

install(TARGETS flint flint_ml flint_gpu EXPORT FlintDataflowTargets
        LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR} NAMELINK_COMPONENT Development)
install(TARGETS flint_cli flint_train_cli RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})
install(DIRECTORY ${CMAKE_SOURCE_DIR}/include/flint DESTINATION ${FLINT_INCLUDEDIR}
        FILES_MATCHING PATTERN "*.h")

# pkg-config: one file per library; ml and gpu require the core. The prefix is written at
# install time, so that `cmake --install --prefix P` needs no reconfigure.
set(FLINT_PREFIX "@FLINT_PREFIX@") # kept for the second pass, at install time
foreach(pc flint-dataflow flint-dataflow-ml flint-dataflow-gpu)
  configure_file(${CMAKE_SOURCE_DIR}/cmake/${pc}.pc.in ${CMAKE_BINARY_DIR}/pkgconfig/${pc}.pc.in @ONLY)
  install(CODE "set(FLINT_PREFIX \"\${CMAKE_INSTALL_PREFIX}\")
    configure_file(\"${CMAKE_BINARY_DIR}/pkgconfig/${pc}.pc.in\" \"${CMAKE_BINARY_DIR}/pkgconfig/${pc}.pc\" @ONLY)")
  install(FILES ${CMAKE_BINARY_DIR}/pkgconfig/${pc}.pc DESTINATION ${CMAKE_INSTALL_LIBDIR}/pkgconfig)
endforeach()

# CMake package: find_package(FlintDataflow) gives the three imported targets.
include(CMakePackageConfigHelpers)
install(EXPORT FlintDataflowTargets NAMESPACE FlintDataflow:: DESTINATION ${FLINT_CMAKEDIR})
configure_package_config_file(${CMAKE_SOURCE_DIR}/cmake/FlintDataflowConfig.cmake.in
                              ${CMAKE_BINARY_DIR}/cmake/FlintDataflowConfig.cmake
                              INSTALL_DESTINATION ${FLINT_CMAKEDIR})
write_basic_package_version_file(${CMAKE_BINARY_DIR}/cmake/FlintDataflowConfigVersion.cmake
                                 COMPATIBILITY SameMinorVersion)
install(FILES ${CMAKE_BINARY_DIR}/cmake/FlintDataflowConfig.cmake
        ${CMAKE_BINARY_DIR}/cmake/FlintDataflowConfigVersion.cmake DESTINATION ${FLINT_CMAKEDIR})

include(CMakePackageConfigHelpers)
install(TARGETS gmjit EXPORT gmjitTargets
  LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR}
  INCLUDES DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
install(TARGETS gmjit_cli RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})
install(DIRECTORY include/gmjit DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
install(EXPORT gmjitTargets NAMESPACE gmjit:: DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/gmjit)
# The package files are made in a folder of their own: a gmjitConfig.cmake in the build folder
# would be found by find_package(gmjit) there, without the gmjitTargets.cmake it includes.
set(gmjit_package_dir ${CMAKE_CURRENT_BINARY_DIR}/package)
write_basic_package_version_file(${gmjit_package_dir}/gmjitConfigVersion.cmake
  COMPATIBILITY SameMinorVersion)
configure_file(cmake/gmjitConfig.cmake.in ${gmjit_package_dir}/gmjitConfig.cmake @ONLY)
install(FILES ${gmjit_package_dir}/gmjitConfig.cmake ${gmjit_package_dir}/gmjitConfigVersion.cmake
  DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/gmjit)

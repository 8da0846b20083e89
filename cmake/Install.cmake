include(CMakePackageConfigHelpers)
install(TARGETS gmjit EXPORT gmjitTargets
  LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR}
  INCLUDES DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
install(TARGETS gmjit_cli RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})
install(DIRECTORY include/gmjit DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
install(EXPORT gmjitTargets NAMESPACE gmjit:: DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/gmjit)
write_basic_package_version_file(${CMAKE_CURRENT_BINARY_DIR}/gmjitConfigVersion.cmake
  COMPATIBILITY SameMinorVersion)
file(WRITE ${CMAKE_CURRENT_BINARY_DIR}/gmjitConfig.cmake
  "include(\${CMAKE_CURRENT_LIST_DIR}/gmjitTargets.cmake)\n")
install(FILES ${CMAKE_CURRENT_BINARY_DIR}/gmjitConfig.cmake
  ${CMAKE_CURRENT_BINARY_DIR}/gmjitConfigVersion.cmake
  DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/gmjit)

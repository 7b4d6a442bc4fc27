#[no_mangle]
pub extern "C" fn nvmlInit_v2() -> u32 { 0 }
